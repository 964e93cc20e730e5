"""Gradio app: upload an image, get its caption, and explore where the model looked, how sure it was of each
word, how much of the image each word used (the gate beta), the other beams, and soft next to hard attention.

    captioner-app                                        # every checkpoint under ./checkpoints (soft first)
    captioner-app --checkpoint runs/mine --checkpoints-dir runs --examples my_photos/ --port 7860

API (see docs/app.md): ``/caption`` (image, beam_size=3, checkpoint=default) -> (caption, one overlay per word);
``/explain`` (same inputs) -> one JSON object. Checkpoints are named by short name, never by server path.
"""

from __future__ import annotations

import argparse
import json
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

from captioner.cli import add_debug_flag, run, user_message  # noqa: E402
from captioner.errors import CaptionerError, CheckpointError  # noqa: E402
from captioner.images import MAX_IMAGE_PIXELS  # noqa: E402
from captioner.serving import (MAX_BEAM_SIZE, MAX_UPLOAD_BYTES, OVERLAY_MAX_AGE_S, OVERLAY_MAX_BYTES,  # noqa: E402
                               OVERLAY_MAX_FILES, BodySizeLimit, ModelCache, OverlayStore, caption_with_overlays,
                               UploadQuota, data_url_bytes, default_checkpoints_dir, example_images, explain,
                               find_checkpoints, highlight, scrub_paths, short_names, smoke_test, soft_first)

PROG = "captioner-app"
CONCURRENCY = 2  # captions computed at once; further requests wait in the queue
QUEUE_SIZE = 64
# Gradio's own temporary files (uploads, copies it serves): every 10 minutes, those older than an hour go.
DELETE_CACHE = (600, 3600)
# Request bodies: a base64 data: URL of a MAX_UPLOAD_BYTES image plus room for the JSON around it.
MAX_BODY_BYTES = MAX_UPLOAD_BYTES * 4 // 3 + 64 * 1024
# Gradio's cache folder (uploads and the files it serves): no new upload once it holds this much.
MAX_CACHE_BYTES = int(os.environ.get("CAPTIONER_APP_MAX_CACHE_MB", "2048")) * 2**20
LARGE_SIDE = 1024  # the large overlay keeps the upload's own resolution up to this long side...
LARGE_MIN_SIDE = 480  # ...and a small image is enlarged to this, so the overlay is large on the page
GRADIO_CACHE = Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")
# Overlays live inside Gradio's cache folder, so Gradio serves them as they are instead of copying each one.
CACHE_DIR = Path(os.environ.get("CAPTIONER_APP_CACHE") or GRADIO_CACHE / "captioner-app")
CHECKPOINTS_DIR: Path | None = None  # None: default_checkpoints_dir() at the time of use
EXAMPLES_DIR: Path | None = None  # None: datasets/shapes/images here, else beside the package

# Gradio may open images with Pillow itself: the same pixel limit as captioner.images, and a warning is an error.
Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
warnings.simplefilter("error", Image.DecompressionBombWarning)

MODELS = ModelCache()
STORE = OverlayStore(CACHE_DIR / "overlays")
SERVED: dict[str, Path] = {}  # short name -> folder, set by build_demo; the first is the default
EMPTY = "Upload an image or pick an example, then press Caption."


def default_examples_dir() -> Path:
    here = Path.cwd() / "datasets" / "shapes" / "images"
    if here.is_dir():
        return here
    import captioner

    return Path(captioner.__file__).resolve().parents[1] / "datasets" / "shapes" / "images"


# ---- checkpoints by short name --------------------------------------------------------------------------------------

def discovered() -> dict[str, Path]:
    """Short names of the default checkpoint folder's checkpoints, soft attention first."""
    return short_names(soft_first(find_checkpoints(CHECKPOINTS_DIR or default_checkpoints_dir())))


def resolve(checkpoint: str | Path | None) -> tuple[str, Path]:
    """(short name, folder) for a short name the app serves (or finds by default), or, from Python, a folder."""
    if checkpoint is None or checkpoint == "":
        names = SERVED or discovered()
        if not names:
            raise CheckpointError("no checkpoint is available; pass --checkpoint FOLDER.")
        return next(iter(names.items()))
    key = str(checkpoint)
    if key in SERVED:
        return key, SERVED[key]
    found = discovered()
    if key in found:
        return key, found[key]
    if Path(key).is_dir():  # a Python caller naming a folder directly (the server never passes these on)
        return Path(key).name, Path(key)
    offered = ", ".join(SERVED or found) or "none"
    raise CheckpointError(f"checkpoint {key!r} is not offered here; choose one of: {offered}.")


def _user_error(error: Exception, image: object = None) -> gr.Error:
    """One sentence for the user, with no server path in it (uploads by file name, checkpoints by short name)."""
    message = user_message(error)
    if message is None:  # a bug, not bad input: let Gradio log it (users see a generic error)
        raise error
    replacements = {str(folder): name for name, folder in {**discovered(), **SERVED}.items()}
    if isinstance(image, (str, Path)):
        inline = Path(image).parent == STORE.folder and Path(image).name.startswith("upload-")
        replacements[str(image)] = "the inline image" if inline else Path(image).name
    replacements[str(CHECKPOINTS_DIR or default_checkpoints_dir())] = "checkpoints"
    return gr.Error(scrub_paths(message, replacements), print_exception=False)


# ---- pure functions (tests call them without a server) -------------------------------------------------------------

def predict(image: str | Path | Image.Image | None, beam_size: int = 3, checkpoint: str | Path | None = None,
            ) -> tuple[str, list[tuple[str, str]]]:
    """Caption ``image`` (a file path or PIL image) with ``checkpoint`` (short name; default: the soft model);
    returns (caption, [(overlay path, "i: word")]). Bad input raises ``gr.Error`` with one sentence."""
    try:
        _, folder = resolve(checkpoint)
        out = caption_with_overlays(MODELS.get(folder), image, beam_size, STORE)
    except Exception as e:  # noqa: BLE001 - _user_error re-raises what is not the user's doing
        raise _user_error(e, image) from None
    return out.text, out.overlays


def explain_json(image: str | Path | Image.Image | None, beam_size: int = 3, checkpoint: str | Path | None = None,
                 ) -> dict:
    """The /explain answer: text, tokens, word_probs, betas, entropies, nbest, truncated, in_domain,
    domain_score, checkpoint (short name)."""
    try:
        name, folder = resolve(checkpoint)
        explanation, _ = explain(MODELS.get(folder), image, beam_size)
    except Exception as e:  # noqa: BLE001
        raise _user_error(e, image) from None
    return explanation.to_json(name)


def word_view(overlays: list[tuple[str, str | None]] | None, caption: str, word: int,
              ) -> tuple[str | None, list[tuple[str, str | None]]]:
    """The overlay and the highlighted caption for word number ``word`` (1-based)."""
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


def _save_data_url(url: str) -> str:
    """An inline image's bytes, undecoded, in the (pruned) overlay store: open_image decodes it like any upload."""
    import base64
    import binascii
    import hashlib

    header, _, payload = url.partition(",")
    try:
        data = base64.b64decode(payload, validate=True) if header.endswith(";base64") else payload.encode()
    except (binascii.Error, ValueError):
        raise gr.Error("the data: URL is not valid base64.", print_exception=False) from None
    path = STORE.folder / f"upload-{hashlib.sha256(data).hexdigest()[:32]}.bin"
    if not path.is_file():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return str(path)


def _image_input() -> gr.Image:
    """An upload box that hands the function the uploaded file's path untouched: decoding happens once, in
    captioner.images.open_image, with its size, pixel, side and aspect limits. An inline data: URL (which the
    20 MB limit of /upload does not see) is refused over the size limit before it is decoded, else saved as bytes
    and decoded by open_image too."""
    component = gr.Image(type="filepath", image_mode=None, label="Image", sources=["upload", "clipboard"],
                         height=320, elem_id="image-input")

    def preprocess(payload):
        if payload is None:
            return None
        url = getattr(payload, "url", None) or ""
        if url.startswith("data:"):
            if data_url_bytes(url) > MAX_UPLOAD_BYTES:
                raise gr.Error(f"the image is over the upload limit of {MAX_UPLOAD_BYTES // 2**20} MB.",
                               print_exception=False)
            return _save_data_url(url)
        path = getattr(payload, "path", None)
        if path is None:
            raise gr.Error("no image given; upload an image or pick an example.", print_exception=False)
        return path  # already checked by Gradio to lie in its upload folder

    component.preprocess = preprocess  # instance attribute: Gradio calls block.preprocess()
    return component


# ---- the explorer's views (pure: PIL / matplotlib in, files out) --------------------------------------------------

PROB_BINS = [(0.9, "sure (p ≥ 0.9)"), (0.5, "likely (0.5–0.9)"), (0.0, "unsure (p < 0.5)")]
PROB_COLOURS = {"sure (p ≥ 0.9)": "#4caf50", "likely (0.5–0.9)": "#ffc107", "unsure (p < 0.5)": "#f44336",
                "cut": "#9e9e9e"}


def probability_words(tokens: list[str], probs: list[float], truncated: bool) -> list[tuple[str, str | None]]:
    """The caption as (word, probability bin) pairs; a caption cut at the length limit ends with a marker."""
    pairs: list[tuple[str, str | None]] = []
    for i, (word, p) in enumerate(zip(tokens, probs)):
        if i:
            pairs.append((" ", None))
        pairs.append((word, next(label for bound, label in PROB_BINS if p >= bound)))
    if truncated:
        pairs += [(" ", None), ("… (cut at the length limit)", "cut")]
    return pairs


def large_overlay(picture: Image.Image, alpha, word: str) -> Image.Image:
    """The word's attention on the picture at its own resolution (a long side outside LARGE_MIN_SIDE..LARGE_SIDE is
    scaled into it), with a colour bar."""
    import numpy as np
    from PIL import ImageDraw, ImageFont

    from captioner.viz import _colormap, overlay

    long_side = max(picture.size)
    scale = min(max(long_side, LARGE_MIN_SIDE), LARGE_SIDE) / long_side
    shown = picture if scale == 1 else picture.resize(
        (max(1, round(picture.width * scale)), max(1, round(picture.height * scale))), Image.Resampling.BICUBIC)
    ov = overlay(shown, alpha)
    bar_w, pad = 24, 64
    sheet = Image.new("RGB", (ov.width + bar_w + pad + 8, max(ov.height, 120)), "white")
    sheet.paste(ov, (0, 0))
    ramp = np.linspace(1.0, 0.0, ov.height, dtype=np.float32)[:, None].repeat(bar_w, 1)  # (H, bar_w): top = most
    sheet.paste(Image.fromarray(_colormap(ramp), "RGB"), (ov.width + 8, 0))
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default(size=13)
    top = float(np.asarray(alpha).max())
    x = ov.width + bar_w + 12
    draw.text((x, 2), f"{top:.3f}", fill="black", font=font)  # the map's largest weight (the bar's top)
    draw.text((x, ov.height - 18), "0", fill="black", font=font)
    draw.text((x, ov.height // 2 - 8), word[:8], fill="black", font=font)
    return sheet


def word_chart(tokens: list[str], probs: list[float], betas: list[float] | None, entropies: list[float],
               chosen: list[float] | None = None):
    """Per-word chart: probability and beta (0..1) as bars, attention entropy (nats) as a line on its own axis;
    for hard attention, ``chosen``: the probability of the location it would pick (the largest alpha)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(tokens) + 2), 3.2), dpi=100)
    x = list(range(len(tokens)))
    width = 0.4 if betas is not None else 0.7
    ax.bar([i - (width / 2 if betas is not None else 0) for i in x], probs, width, label="p(word)", color="#1976d2")
    if betas is not None:
        ax.bar([i + width / 2 for i in x], betas, width, label="β (gate)", color="#ff9800")
    if chosen is not None:
        ax.plot(x, chosen, "s--", color="#2e7d32", label="p(chosen location)")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(x, tokens, rotation=45, ha="right")
    ax.set_ylabel("probability / β")
    twin = ax.twinx()
    twin.plot(x, entropies, "o-", color="#6a1b9a", label="attention entropy")
    twin.set_ylabel("entropy (nats)")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1.22), ncol=4, frameon=False)
    fig.tight_layout()
    return fig


def model_card(name: str) -> str:
    """The checkpoint's MODEL_CARD.md (or its config summary), with no server path in it."""
    try:
        _, folder = resolve(name)
    except CaptionerError as e:
        return str(e)
    card = folder / "MODEL_CARD.md"
    text = card.read_text(errors="replace")[:20_000] if card.is_file() else f"No MODEL_CARD.md in `{name}`."
    return scrub_paths(text, {str(folder): name, str(folder.parent): "checkpoints"})


def _explore(image, beam_size, checkpoint):
    """Everything the explorer shows for one caption (one model pass + one teacher-forced pass)."""
    from captioner.viz import attention_figure, word_overlays

    try:
        name, folder = resolve(checkpoint)
        model = MODELS.get(folder)
        explanation, picture = explain(model, image, beam_size)
    except Exception as e:  # noqa: BLE001
        raise _user_error(e, image) from None
    small = picture.copy()
    small.thumbnail((LARGE_SIDE, LARGE_SIDE))  # what the session keeps: enough for the large overlay
    overlays = [(str(STORE.save(ov)), label)
                for ov, label in word_overlays(picture, explanation.tokens, explanation.alphas)]
    data = explanation.to_json(name, with_alphas=True)
    json_path = STORE.folder / f"caption-{abs(hash((explanation.text, name, str(image)))) % 10**12}.json"
    json_path.write_text(json.dumps(data, indent=1))
    figure_path = STORE.save(attention_figure(picture, explanation.tokens, explanation.alphas))
    STORE.prune()
    return explanation, small, overlays, name, str(json_path), str(figure_path)


def _nbest_rows(nbest: list[dict]) -> list[list]:
    return [[i + 1, h["text"], round(h["log_prob"], 3)] for i, h in enumerate(nbest)]


# ---- the page --------------------------------------------------------------------------------------------------------

def build_demo(checkpoints: list[str | Path] | dict[str, Path], examples: list[str | Path] | None = None,
               ) -> gr.Blocks:
    """The whole UI for these checkpoint folders (a list, or {short name: folder}); the first is the default."""
    served = dict(checkpoints) if isinstance(checkpoints, dict) else short_names([Path(c) for c in checkpoints],
                                                                                 [str(c) for c in checkpoints])
    if not served:
        raise CaptionerError("build_demo needs at least one checkpoint folder.")
    SERVED.clear()
    SERVED.update(served)
    choices = list(served)
    default = choices[0]
    other = next((n for n in choices[1:] if served[n] != served[default]), default)
    if examples is None:
        examples = example_images(EXAMPLES_DIR or default_examples_dir())

    def offered(checkpoint: str) -> str:
        if checkpoint not in choices:  # API callers must not name arbitrary folders (the dropdown checks too)
            raise gr.Error(f"checkpoint {checkpoint!r} is not served here; choose one of: {', '.join(choices)}.",
                           print_exception=False)
        return checkpoint

    def caption(image: str, beam_size: float = 3, checkpoint: str = default):
        return predict(image, beam_size, offered(checkpoint))

    def explain_api(image: str, beam_size: float = 3, checkpoint: str = default):
        return explain_json(image, beam_size, offered(checkpoint))

    def run_ui(image, beam_size, checkpoint):
        explanation, small, overlays, name, json_path, figure_path = _explore(image, beam_size, offered(checkpoint))
        state = {"picture": small, "alphas": explanation.alphas, "tokens": explanation.tokens}
        large = large_overlay(small, explanation.alphas[0], explanation.tokens[0]) if explanation.tokens else None
        count = len(explanation.tokens)
        note = ("**Cut at the length limit:** the model had not finished this caption."
                if explanation.truncated else "")
        if explanation.in_domain is False:
            note += "\n\n**This image looks unlike the training images**; the caption may be meaningless."
        return (explanation.text, overlays,
                probability_words(explanation.tokens, explanation.word_probs, explanation.truncated), note,
                gr.Slider(minimum=1, maximum=max(2, count), value=1, step=1, interactive=count > 1),
                large, highlight(explanation.tokens, 0),
                word_chart(explanation.tokens, explanation.word_probs, explanation.betas, explanation.entropies,
                           [float(a.max()) for a in explanation.alphas]
                           if MODELS.get(resolve(checkpoint)[1]).cfg.attention == "hard" else None),
                _nbest_rows(explanation.nbest), [json_path, figure_path], state)

    def show_word(state, word):
        if not state or not state.get("tokens"):
            return None, []
        tokens = state["tokens"]
        index = min(max(int(word), 1), len(tokens)) - 1
        return large_overlay(state["picture"], state["alphas"][index], tokens[index]), highlight(tokens, index)

    def select_word(state, evt: gr.SelectData):
        """A click on a word of the probability-coloured caption: its number (spaces are entries too)."""
        index = evt.index if isinstance(evt.index, int) else evt.index[0]
        return gr.Slider(value=index // 2 + 1)

    def compare(image, beam_size, left, right):
        rows, texts = [], []
        results = []
        for name in (left, right):
            explanation, *_ = _explore(image, beam_size, offered(name))
            results.append(explanation)
            texts.append(probability_words(explanation.tokens, explanation.word_probs, explanation.truncated))
        a, b = results
        for i in range(max(len(a.tokens), len(b.tokens))):
            rows.append([i + 1,
                         a.tokens[i] if i < len(a.tokens) else "", round(a.word_probs[i], 3) if i < len(a.tokens) else None,
                         b.tokens[i] if i < len(b.tokens) else "", round(b.word_probs[i], 3) if i < len(b.tokens) else None])
        return texts[0], texts[1], rows

    with gr.Blocks(title="captioner: Show, Attend and Tell", delete_cache=DELETE_CACHE) as demo:
        gr.Markdown("# Show, Attend and Tell\nUpload an image or pick an example: the model writes a caption and, "
                    "for each word, shows where it looked (brighter = more attention), how sure it was, and how "
                    "much of the image the word used (the gate β).")
        state = gr.State(None)
        with gr.Tab("Explore"):
            with gr.Row():
                with gr.Column(scale=1):
                    image = _image_input()
                    if examples:
                        gr.Examples([[str(p)] for p in examples], inputs=[image], label="Examples")
                    beam = gr.Slider(1, MAX_BEAM_SIZE, value=3, step=1, label="Beam size (1 = greedy)")
                    checkpoint = gr.Dropdown(choices, value=default, label="Checkpoint", elem_id="checkpoint")
                    button = gr.Button("Caption", variant="primary", elem_id="caption-button")
                with gr.Column(scale=2):
                    text = gr.Textbox(label="Caption", interactive=False, elem_id="caption-text", placeholder=EMPTY)
                    probs = gr.HighlightedText(label="Caption by word probability (click a word)",
                                               color_map=PROB_COLOURS, show_legend=True, elem_id="word-probs")
                    note = gr.Markdown("", elem_id="caption-note")
                    word = gr.Slider(1, 2, value=1, step=1, label="Word", interactive=False, elem_id="word-slider")
                    highlighted = gr.HighlightedText(label="Caption, word by word", color_map={"current": "orange"},
                                                     show_legend=False, elem_id="caption-words")
            large = gr.Image(label="Attention for the current word (on the image at its own resolution)",
                             type="pil", interactive=False, format="png", height=480, elem_id="word-overlay")
            gallery = gr.Gallery(label="Attention per word", columns=6, height="auto", object_fit="contain",
                                 interactive=False, elem_id="overlays")
            chart = gr.Plot(label="Per word: probability, β and attention entropy", elem_id="word-chart")
            nbest = gr.Dataframe(headers=["rank", "caption", "log-prob"], label="Beam search: n-best",
                                 interactive=False, elem_id="nbest")
            downloads = gr.File(label="Downloads: caption JSON (tokens, probabilities, β, α maps) and figure PNG",
                                file_count="multiple", interactive=False, elem_id="downloads")
        with gr.Tab("Compare"):
            gr.Markdown("The same image through two checkpoints, word by word (uses the image and beam size of "
                        "the Explore tab).")
            with gr.Row():
                left = gr.Dropdown(choices, value=default, label="Left", elem_id="compare-left")
                right = gr.Dropdown(choices, value=other, label="Right", elem_id="compare-right")
            compare_button = gr.Button("Compare", elem_id="compare-button")
            with gr.Row():
                left_text = gr.HighlightedText(label="Left", color_map=PROB_COLOURS, elem_id="compare-left-text")
                right_text = gr.HighlightedText(label="Right", color_map=PROB_COLOURS, elem_id="compare-right-text")
            table = gr.Dataframe(headers=["#", "left word", "left p", "right word", "right p"], interactive=False,
                                 elem_id="compare-table")
        with gr.Tab("Model card"):
            card = gr.Markdown(model_card(default), elem_id="model-card")
        explained = gr.JSON(visible=False)

        # The API: two endpoints with their own hidden triggers, so the page's richer event can change freely.
        api_caption = gr.Button(visible=False)
        api_caption.click(caption, [image, beam, checkpoint], [text, gallery], api_name="caption")
        api_explain = gr.Button(visible=False)
        api_explain.click(explain_api, [image, beam, checkpoint], [explained], api_name="explain")

        button.click(run_ui, [image, beam, checkpoint],
                     [text, gallery, probs, note, word, large, highlighted, chart, nbest, downloads, state],
                     api_name=False)
        word.change(show_word, [state, word], [large, highlighted], api_name=False)
        probs.select(select_word, [state], [word], api_name=False)
        checkpoint.change(model_card, [checkpoint], [card], api_name=False)
        compare_button.click(compare, [image, beam, left, right], [left_text, right_text, table], api_name=False)
    demo.queue(default_concurrency_limit=CONCURRENCY, max_size=QUEUE_SIZE)
    return demo


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int = 7860, prevent_thread_lock: bool = False,
           examples_dir: str | Path | None = None):
    """Start the server with this app's limits (local only, no share link, no SSR, bounded request bodies)."""
    from starlette.middleware import Middleware

    allowed = [str(STORE.folder)] + ([str(examples_dir)] if examples_dir else [])
    return demo.launch(server_name=host, server_port=port, share=False, ssr_mode=False,
                       max_file_size=MAX_UPLOAD_BYTES, allowed_paths=allowed, prevent_thread_lock=prevent_thread_lock,
                       show_error=True, footer_links=["api"],
                       app_kwargs={"middleware": [Middleware(BodySizeLimit, max_bytes=MAX_BODY_BYTES),
                                                  Middleware(UploadQuota, folder=GRADIO_CACHE,
                                                             max_bytes=MAX_CACHE_BYTES)]})


# ---- command line ----------------------------------------------------------------------------------------------------

def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535).") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (1-65535).")
    return value


def folder(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a folder.")
    return path


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Web app: caption an image and explore its attention, word by word.")
    parser.add_argument("--checkpoint", action="append", default=None, metavar="FOLDER",
                        help="checkpoint folder to offer; repeat for several; the first is the default and its "
                             "short name is the folder name (default: every checkpoint under --checkpoints-dir)")
    parser.add_argument("--checkpoints-dir", type=folder, action="append", default=None, metavar="DIR",
                        help="offer every checkpoint folder (one with a config.json) under DIR, e.g. runs/; "
                             "repeatable (default, when no --checkpoint is given: ./checkpoints if it exists, else "
                             "the repository's checkpoints/ beside the package; soft attention first)")
    parser.add_argument("--examples", type=folder, default=None, metavar="DIR",
                        help="folder of example images offered on the page (default: the first test images of "
                             "datasets/shapes/images, when present)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=port_number, default=7860, help="port to listen on, 1-65535 (default: 7860)")
    add_debug_flag(parser)
    # A bad flag is one line (the usage is in --help), like every other user error.
    parser.error = lambda message: parser.exit(2, f"{PROG}: error: {message}\n")  # type: ignore[method-assign]
    return parser


def served_checkpoints(args: argparse.Namespace) -> dict[str, Path]:
    """{short name: folder} from the flags; each folder loaded fully now, so a broken one stops the start."""
    folders: list[Path] = []
    given: list[str] = []
    for text in args.checkpoint or []:
        folders.append(Path(text))
        given.append(text)
    for root in args.checkpoints_dir or []:
        found = find_checkpoints(root)
        if not found:
            raise CheckpointError(f"--checkpoints-dir {root}: no checkpoint folder (one with a config.json) in it.")
        folders += found
        given += [str(f) for f in found]
    if not folders:
        root = CHECKPOINTS_DIR or default_checkpoints_dir()
        folders = soft_first(find_checkpoints(root))
        given = [str(f) for f in folders]
        if not folders:
            raise CheckpointError(f"no checkpoint found (no folder with a config.json under {root}); "
                                  "train one or pass --checkpoint FOLDER.")
    names = short_names(folders, given)
    for name, path in names.items():
        try:
            smoke_test(MODELS.get(path))  # everything (config, vocabulary, weights, finite outputs) now
        except Exception as e:  # noqa: BLE001 - any failure here means the app cannot serve this checkpoint
            reason = user_message(e) or f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            raise CheckpointError(f"checkpoint {name} cannot be served: {reason}") from e
    return names


def main(args: argparse.Namespace) -> int:
    names = served_checkpoints(args)
    examples = example_images(args.examples, prefix="") if args.examples else None
    demo = build_demo(names, examples=examples)
    launch(demo, host=args.host, port=args.port, examples_dir=args.examples or EXAMPLES_DIR or default_examples_dir())
    return 0


def cli() -> int:
    return run(main, get_args_parser(), prog=PROG)


if __name__ == "__main__":
    sys.exit(cli())
