"""Gradio app: upload an image, get its caption and where the model looked for each word.

    python app.py                                   # every checkpoints/*/ with a config.json
    python app.py --checkpoint checkpoints/shapes-soft --port 7860

API: ``POST /caption`` (image, beam_size=3, checkpoint=first) -> (caption, one overlay per word); see docs/app.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

# Before gradio is imported: no analytics, no Hugging Face calls.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gradio as gr  # noqa: E402
from PIL import Image  # noqa: E402

from captioner.errors import CaptionerError  # noqa: E402
from captioner.images import MAX_IMAGE_PIXELS  # noqa: E402
from captioner.serving import (MAX_BEAM_SIZE, ModelCache, OverlayStore, caption_with_overlays,  # noqa: E402
                               example_images, find_checkpoints, highlight)

ROOT = Path(__file__).resolve().parent
CHECKPOINTS_DIR = ROOT / "checkpoints"
EXAMPLES_DIR = ROOT / "datasets" / "shapes" / "images"
CACHE_DIR = Path(os.environ.get("CAPTIONER_APP_CACHE", Path(tempfile.gettempdir()) / "captioner-app"))
MAX_FILE_SIZE = "20mb"  # per upload; a small file with huge dimensions is stopped by the pixel limit instead
CONCURRENCY = 2  # captions computed at once; further requests wait in the queue
QUEUE_SIZE = 64

# Gradio opens uploads with Pillow itself: the same pixel limit as captioner.images, and a warning is an error.
Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
warnings.simplefilter("error", Image.DecompressionBombWarning)

MODELS = ModelCache()
STORE = OverlayStore(CACHE_DIR / "overlays")


def predict(image: str | Path | Image.Image, beam_size: int = 3, checkpoint: str | Path | None = None,
            ) -> tuple[str, list[tuple[str, str]]]:
    """Caption ``image`` (a file path or PIL image) with ``checkpoint``; returns (caption, [(overlay path, "i: word")]).

    Raises ``gr.Error`` with one sentence for bad input (not an image, too many pixels, bad beam size).
    """
    if checkpoint is None:
        raise gr.Error("no checkpoint selected.")
    try:
        out = caption_with_overlays(MODELS.get(checkpoint), image, beam_size, STORE)
    except CaptionerError as e:
        raise gr.Error(str(e), print_exception=False) from None
    return out.text, out.overlays


def word_view(overlays: list[tuple[str, str | None]] | None, caption: str, word: int,
              ) -> tuple[str | None, list[tuple[str, str | None]]]:
    """The large overlay and the highlighted caption for word number ``word`` (1-based)."""
    tokens = caption.split() if caption else []
    if not overlays or not tokens:
        return None, highlight(tokens, -1)
    index = min(max(int(word), 1), len(overlays)) - 1
    return overlays[index][0], highlight(tokens, index)


def reset_word_view(overlays: list[tuple[str, str | None]] | None, caption: str):
    """After a new caption: the slider spans its words and shows the first one."""
    image, highlighted = word_view(overlays, caption, 1)
    count = len(overlays or [])
    # Gradio needs maximum > minimum: a one-word caption gets a 1..2 slider, locked (word_view clamps anyway).
    return gr.Slider(minimum=1, maximum=max(2, count), value=1, step=1, interactive=count > 1), image, highlighted


def _image_input() -> gr.Image:
    """An upload box that hands the function a file path (decoded later with the bomb guard); a file that
    Pillow cannot even open gets one clear sentence instead of Gradio's generic error."""
    component = gr.Image(type="filepath", image_mode=None, label="Image", sources=["upload", "clipboard"],
                         height=320)
    original = component.preprocess

    def preprocess(payload):
        try:
            return original(payload)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise gr.Error(f"the image has too many pixels (the limit is {MAX_IMAGE_PIXELS:,}).",
                           print_exception=False) from None
        except (Image.UnidentifiedImageError, OSError, ValueError, SyntaxError):
            raise gr.Error("the upload is not an image file this app can read (try PNG or JPEG).",
                           print_exception=False) from None

    component.preprocess = preprocess  # instance attribute: Gradio calls block.preprocess()
    return component


def build_demo(checkpoints: list[str | Path], examples: list[str | Path] | None = None) -> gr.Blocks:
    """The whole UI for these checkpoint folders (the first is the default)."""
    choices = [str(c) for c in checkpoints]
    if not choices:
        raise CaptionerError("build_demo needs at least one checkpoint folder.")
    if examples is None:
        examples = example_images(EXAMPLES_DIR)

    def caption(image: str, beam_size: float = 3, checkpoint: str = choices[0]):
        if checkpoint not in choices:  # API callers must not name arbitrary folders (the dropdown checks too)
            raise gr.Error(f"checkpoint {checkpoint!r} is not served here; choose one of: {', '.join(choices)}.",
                           print_exception=False)
        return predict(image, beam_size, checkpoint)

    with gr.Blocks(title="captioner: Show, Attend and Tell") as demo:
        gr.Markdown("# Show, Attend and Tell\nUpload an image: the model writes a caption, and for each word "
                    "shows where it looked (brighter = more attention).")
        with gr.Row():
            with gr.Column(scale=1):
                image = _image_input()
                if examples:
                    gr.Examples([[str(p)] for p in examples], inputs=[image], label="Examples")
                beam = gr.Slider(1, MAX_BEAM_SIZE, value=3, step=1, label="Beam size (1 = greedy)")
                checkpoint = gr.Dropdown(choices, value=choices[0], label="Checkpoint")
                button = gr.Button("Caption", variant="primary", elem_id="caption-button")
            with gr.Column(scale=2):
                text = gr.Textbox(label="Caption", interactive=False, elem_id="caption-text")
                gallery = gr.Gallery(label="Attention per word", columns=5, height="auto", object_fit="contain",
                                     elem_id="overlays")
        with gr.Row():
            with gr.Column(scale=1):
                word = gr.Slider(1, 2, value=1, step=1, label="Word", interactive=False, elem_id="word-slider")
                highlighted = gr.HighlightedText(label="Caption, word by word",
                                                 color_map={"current": "orange"}, show_legend=False,
                                                 elem_id="caption-words")
            with gr.Column(scale=2):
                large = gr.Image(label="Attention for the current word", type="filepath", interactive=False,
                                 height=448, elem_id="word-overlay")

        button.click(caption, [image, beam, checkpoint], [text, gallery], api_name="caption").then(
            reset_word_view, [gallery, text], [word, large, highlighted], api_name=False)
        word.change(word_view, [gallery, text, word], [large, highlighted], api_name=False)
    demo.queue(default_concurrency_limit=CONCURRENCY, max_size=QUEUE_SIZE)
    return demo


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int = 7860, prevent_thread_lock: bool = False,
           examples_dir: str | Path = EXAMPLES_DIR):
    """Start the server with this app's limits (local only, no share link, no SSR)."""
    return demo.launch(server_name=host, server_port=port, share=False, ssr_mode=False,
                       max_file_size=MAX_FILE_SIZE, allowed_paths=[str(STORE.folder), str(examples_dir)],
                       prevent_thread_lock=prevent_thread_lock, show_error=True, footer_links=["api"])


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Web app: caption an image and show its attention per word.")
    parser.add_argument("--checkpoint", action="append", default=None, metavar="FOLDER",
                        help="checkpoint folder to offer; repeat for several (default: every folder under "
                             "checkpoints/ next to app.py that has a config.json)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=7860, help="port to listen on (default: 7860)")
    return parser


def main(args: argparse.Namespace) -> int:
    from captioner.checkpoint import read_config

    checkpoints = [Path(c) for c in args.checkpoint] if args.checkpoint else find_checkpoints(CHECKPOINTS_DIR)
    if not checkpoints:
        print(f"app.py: no checkpoint found (no folder with a config.json under {CHECKPOINTS_DIR}); "
              "train one or pass --checkpoint FOLDER.", file=sys.stderr)
        return 2
    try:
        for folder in checkpoints:
            read_config(folder)  # fail now, in one sentence, rather than at the first request
    except CaptionerError as e:
        print(f"app.py: {e}", file=sys.stderr)
        return 2
    launch(build_demo(checkpoints), host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
