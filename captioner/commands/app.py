"""Gradio app: upload an image, get its caption, and explore where the model looked, how sure it was of each
word, how much of the image each word used (the gate beta), the other beams, and soft next to hard attention.

    captioner-app                                        # every checkpoint under ./checkpoints (soft first)
    captioner-app --checkpoint runs/mine --checkpoints-dir runs --examples my_photos/ --port 7860
    captioner-app --runtime onnx --checkpoint exported/shapes-soft   # ONNX Runtime, no torch (docs/onnx.md)

API (see docs/app.md): ``/caption`` (image, beam_size=3, checkpoint=default) -> (caption, one overlay per word);
``/explain`` (same inputs) -> one JSON object; ``/explain_regions`` (the same and ``regions``, JSON boxes that steer
the caption: docs/regions.md); and, outside Gradio, ``POST /v1/explain`` with the image as the body (the same JSON
in one round trip: captioner.serving.rest). Checkpoints are named by short name, never by server path.

On the ONNX Runtime route (``--runtime onnx``: folders written by ``captioner-export onnx``) nothing here imports
torch; everything works the same except regions (``/explain_regions`` and the Point and tell tab), which need
PyTorch: the endpoint refuses them in one sentence and the tab is left out.

This module holds the app's state (models, overlay store, served checkpoints), the request handlers that use it,
the server's limits and ``main`` (about 350 lines: the handlers stay beside the module state that tests patch
here); the page layout is in app_page, the explorer's pictures in app_views, the upload box in app_uploads, the
flags in app_args.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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

from captioner.commands.runner import run, user_message  # noqa: E402
from captioner.app.args import PROG, folder, get_args_parser, port_number  # noqa: E402,F401
from captioner.app.attention import attention_payload  # noqa: E402
from captioner.app.page import Handlers, page  # noqa: E402
from captioner.app.uploads import image_input  # noqa: E402
from captioner.app.views import (LARGE_MIN_SIDE, LARGE_SIDE, PROB_BINS, PROB_COLOURS,  # noqa: E402,F401
                                          large_overlay, nbest_rows, probability_words, word_chart)
from captioner.errors import CaptionerError, CheckpointError  # noqa: E402
from captioner.images import MAX_IMAGE_PIXELS  # noqa: E402
from captioner.serving.inputs import parse_regions  # noqa: E402
from captioner.serving import (MAX_UPLOAD_BYTES, Batcher, BodySizeLimit, FileRegistry, Health,  # noqa: E402
                               ModelCache, OpaqueFiles, OverlayStore, ServerState, UploadQuota, check_beam_size,
                               default_checkpoints_dir, example_images, explain_batch, find_checkpoints, gallery,
                               highlight, load_picture, out_of_domain_notice, scrub_paths, short_names,
                               smoke_test, soft_first)
from captioner.serving.checkpoints import default_runtime  # noqa: E402
from captioner.serving.explain import (REGIONS_NEED_TORCH, Explanation, RegionsNeedTorch,  # noqa: E402
                                       attention_of, is_onnx, region_weights_of)
from captioner.serving.rest import RestApi  # noqa: E402

# Request bodies: a base64 data: URL of a MAX_UPLOAD_BYTES image plus room for the JSON around it.
MAX_BODY_BYTES = MAX_UPLOAD_BYTES * 4 // 3 + 64 * 1024
# Gradio's cache folder (uploads and the files it serves): no new upload once it holds this much.
MAX_CACHE_BYTES = int(os.environ.get("CAPTIONER_APP_MAX_CACHE_MB", "2048")) * 2**20
GRADIO_CACHE = Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")
# Overlays live inside Gradio's cache folder, so Gradio serves them as they are instead of copying each one.
CACHE_DIR = Path(os.environ.get("CAPTIONER_APP_CACHE") or GRADIO_CACHE / "captioner-app")
CHECKPOINTS_DIR: Path | None = None  # None: default_checkpoints_dir() at the time of use
THREADS: int | None = None  # torch threads of the model (--threads); None: chosen per batch (_set_threads)
EXAMPLES_DIR: Path | None = None  # None: datasets/shapes/images here, else beside the package

# Gradio may open images with Pillow itself: the same pixel limit as captioner.images, and a warning is an error.
Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
warnings.simplefilter("error", Image.DecompressionBombWarning)

MODELS = ModelCache()  # its runtime: None (each folder by what it holds) until main sets --runtime
STORE = OverlayStore(CACHE_DIR / "overlays")
SERVED: dict[str, Path] = {}  # short name -> folder, set by build_demo; the first is the default


def _run_batch(key: tuple[Path, int, object], items: list[tuple]) -> list[Explanation]:
    """The model's side of the batcher: decoded pictures for one checkpoint and beam size, as one batch. Torch runs
    in this one thread only (preprocessing and loading the models included: ``served_checkpoints`` loads through
    ``BATCHER.call``): each thread that calls torch keeps its own OpenMP workers, and thirty request threads doing
    so starved the model of the 2 cores; the main thread's team alone, from loading, made each batch twice as slow."""
    folder, beam_size, steered = key
    model = MODELS.get(folder)
    if not is_onnx(model):  # ONNX Runtime keeps its own threads (captioner.runtime), and torch is not imported
        _set_threads(alone=len(items) == 1 and not BATCHER.waiting)
    pictures, measure, boxes = zip(*items)
    weights = region_weights_of(model, pictures[0], boxes[0]) if steered is not None else None  # a batch of one
    return explain_batch(model, [model.transform(p) for p in pictures], [p.size for p in pictures], beam_size,
                         list(measure), weights=weights)


def _set_threads(alone: bool) -> None:
    """Torch's threads for the next batch: ``THREADS`` when set, else all of torch's threads (every core, or
    OMP_NUM_THREADS) for a request alone and one fewer while others wait. Under load the request threads and the
    event loop need a core: a model using both of 2 cores then waited on its own second thread at every step (16
    clients: 5.4 requests/s against 17.4 with one thread, bench/app_load.py side by side), while a lone request is
    10-15% faster with both."""
    import torch

    global _ALL_THREADS
    if _ALL_THREADS is None:  # torch's own choice in this thread: every core, or OMP_NUM_THREADS when set
        _ALL_THREADS = torch.get_num_threads()
    want = THREADS or (_ALL_THREADS if alone else max(1, _ALL_THREADS - 1))
    if torch.get_num_threads() != want:
        torch.set_num_threads(want)


_ALL_THREADS: int | None = None


# Concurrent requests for the same checkpoint and beam size share one batched model call; past its bound, "busy".
BATCHER = Batcher(_run_batch)
# /healthz and the clean shutdown on SIGTERM (requests in flight finish, new ones get a quick 503)
STATE = ServerState(models=lambda: {name: MODELS.loaded(folder) for name, folder in SERVED.items()},
                    queue=BATCHER.report)
DRAIN_S = 30.0  # on SIGTERM, how long requests in flight may take to finish
# Gradio keeps one session per page visit *and per API call* (each /gradio_api/call/... is a session of its own),
# each with a copy of the whole page's config (some 50 kB here), the oldest dropped past this many: its default of
# 10,000 let a server under API load grow by about half a gigabyte before levelling off. A page visit's own state
# (the last caption, for the downloads and the word highlight) lives as long as its session is among the newest.
SESSIONS = 2000


def default_examples_dir() -> Path:
    here = Path.cwd() / "datasets" / "shapes" / "images"
    if here.is_dir():
        return here
    import captioner

    return Path(captioner.__file__).resolve().parents[1] / "datasets" / "shapes" / "images"


# ---- checkpoints by short name --------------------------------------------------------------------------------------

def runtime() -> str:
    """The runtime the app serves with: --runtime, else torch where it is installed, else onnx."""
    return MODELS.runtime or default_runtime()


def checkpoints_dir() -> Path:
    """Where checkpoints are found by default: CHECKPOINTS_DIR, else ``default_checkpoints_dir`` for the runtime."""
    return CHECKPOINTS_DIR or default_checkpoints_dir(runtime=runtime())


def discovered() -> dict[str, Path]:
    """Short names of the default checkpoint folder's checkpoints, soft attention first."""
    return short_names(soft_first(find_checkpoints(checkpoints_dir(), runtime())))


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
    replacements[str(checkpoints_dir())] = "checkpoints"
    return gr.Error(scrub_paths(message, replacements), print_exception=False)


# ---- pure functions (tests call them without a server) -------------------------------------------------------------

def _submit(image, beam_size, checkpoint, measure: bool, regions=None):
    """Decode the upload here (with its limits), then queue it for the model: (short name, picture, future).
    A caption steered by ``regions`` (boxes, or their JSON) is a batch of its own."""
    name, folder = resolve(checkpoint)
    boxes = parse_regions(regions)
    if boxes and MODELS.runtime_of(folder) == "onnx":
        raise RegionsNeedTorch(REGIONS_NEED_TORCH)
    picture = load_picture(image)
    beam = check_beam_size(beam_size)
    steered = object() if boxes else None  # a key no other request shares
    return name, picture, BATCHER.submit((folder.resolve(), beam, steered), (picture, measure, boxes))


def _explained(image, beam_size, checkpoint, measure: bool = True, regions=None,
               ) -> tuple[str, Image.Image, Explanation]:
    """(short name, picture, explanation) of one image, through the batcher; bad input raises ``gr.Error``."""
    try:
        name, picture, future = _submit(image, beam_size, checkpoint, measure, regions)
        return name, picture, future.result()
    except Exception as e:  # noqa: BLE001 - _user_error re-raises what is not the user's doing
        raise _user_error(e, image) from None


def predict(image: str | Path | Image.Image | None, beam_size: int = 3, checkpoint: str | Path | None = None,
            ) -> tuple[str, list[tuple[str, str]]]:
    """Caption ``image`` (a file path or PIL image) with ``checkpoint`` (short name; default: the soft model);
    returns (caption, [(overlay path, "i: word")]). Bad input raises ``gr.Error`` with one sentence."""
    _, picture, explanation = _explained(image, beam_size, checkpoint, measure=False)
    return explanation.text, gallery(picture, explanation, STORE)


def explain_json(image: str | Path | Image.Image | None, beam_size: int = 3, checkpoint: str | Path | None = None,
                 regions: str | list | None = None, with_alphas: bool = False) -> dict:
    """The /explain answer: text, tokens, word_probs, betas, entropies, nbest, truncated, in_domain,
    domain_score, checkpoint (short name); ``regions`` (boxes in the image's pixels, or their JSON) steer the
    caption (docs/regions.md), and the answer then has each word's region; ``with_alphas``: each word's map too."""
    name, _, explanation = _explained(image, beam_size, checkpoint, regions=regions)
    return explanation.to_json(name, with_alphas=with_alphas)


def rest_explain(body: bytes, query: dict[str, str]) -> tuple[int, dict]:
    """POST /v1/explain (captioner.serving.rest): the image in ``body``, the settings in ``query``; returns (HTTP
    status, JSON): 200 and the /explain answer, 400 and {"error": one sentence}, 503 when the model's queue is full."""
    import io

    from captioner.images import open_image
    from captioner.serving import Busy

    try:
        checkpoint = query.get("checkpoint") or next(iter(SERVED), None)
        if SERVED and checkpoint not in SERVED:  # only what the server offers, never a folder on its disk
            raise CheckpointError(f"checkpoint {checkpoint!r} is not served here; choose one of: "
                                  f"{', '.join(SERVED)}.")
        if not body:
            raise CaptionerError("no image given: POST the image file as the request body.")
        upload = io.BytesIO(body)
        upload.name = "the request body"  # what an error message calls it
        picture = open_image(upload)
        name, _, future = _submit(picture, query.get("beam_size", 3), checkpoint, True, query.get("regions"))
        explanation = future.result()
    except Busy as e:
        return 503, {"error": str(e)}
    except Exception as e:  # noqa: BLE001 - _user_error re-raises what is not the user's doing
        return 400, {"error": _user_error(e).message}
    return 200, explanation.to_json(name, with_alphas=query.get("alphas", "").lower() in ("1", "true", "yes"))


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


def _image_input() -> gr.Image:
    """The upload box; inline data: URLs are saved in the overlay store's folder (pruned with it)."""
    return image_input(lambda: STORE.folder)


def model_card(name: str) -> str:
    """The checkpoint's MODEL_CARD.md (or its config summary), with no server path in it."""
    try:
        _, folder = resolve(name)
    except CaptionerError as e:
        return str(e)
    card = folder / "MODEL_CARD.md"
    text = card.read_text(errors="replace")[:20_000] if card.is_file() else f"No MODEL_CARD.md in `{name}`."
    return scrub_paths(text, {str(folder): name, str(folder.parent): "checkpoints"})


def downloads(state: dict | None, word: float = 1) -> list[str]:
    """Written only when asked: the caption JSON (with the α maps), the paper-style figure and the current word's
    overlay with its colour bar (PNG)."""
    from captioner.viz import attention_figure

    if not state or not state.get("explanation"):
        raise gr.Error("caption an image first.", print_exception=False)
    explanation, picture = state["explanation"], state["picture"]
    data = explanation.to_json(state["name"], with_alphas=True)
    paths = [STORE.save_bytes(json.dumps(data, indent=1).encode(), ".json", prefix="caption-"),
             STORE.save(attention_figure(picture, explanation.tokens, explanation.alphas))]
    if explanation.tokens:
        index = min(max(int(word or 1), 1), len(explanation.tokens)) - 1
        paths.append(STORE.save(large_overlay(picture, explanation.alphas[index], explanation.tokens[index])))
    STORE.prune()
    return [str(p) for p in paths]


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

    def explain_api(image: str, beam_size: float = 3, checkpoint: str = default, regions: str = ""):
        return explain_json(image, beam_size, offered(checkpoint), regions)

    def run_ui(image, beam_size, checkpoint):
        name, picture, explanation = _explained(image, beam_size, offered(checkpoint))
        small = picture.copy()
        small.thumbnail((LARGE_SIDE, LARGE_SIDE))  # what the session keeps: enough for the figures on request
        state = {"picture": small, "explanation": explanation, "name": name}
        count = len(explanation.tokens)
        note = ("**Cut at the length limit:** the model had not finished this caption."
                if explanation.truncated else "")
        model = MODELS.get(resolve(name)[1])
        # above the caption: the checkpoint's domain check found the image unlike its training images
        notice = out_of_domain_notice(model) if explanation.in_domain is False else ""
        if explanation.warning:  # a tiny, elongated or empty-caption image, as caption.py says it
            warning = f"⚠️ {explanation.warning[0].upper()}{explanation.warning[1:]}"
            notice = f"{notice}\n\n{warning}" if notice else warning
        chosen = [float(a.max()) for a in explanation.alphas] if attention_of(model) == "hard" else None
        return (notice, explanation.text,
                probability_words(explanation.tokens, explanation.word_probs, explanation.truncated), note,
                gr.Slider(minimum=1, maximum=max(2, count), value=1, step=1, interactive=count > 1),
                attention_payload(small, explanation.tokens, explanation.alphas), highlight(explanation.tokens, 0),
                word_chart(explanation.tokens, explanation.word_probs, explanation.betas, explanation.entropies,
                           chosen),
                nbest_rows(explanation.nbest), None, state)

    def show_word(state, word):
        """The caption with word number ``word`` marked (the overlay itself is redrawn in the browser)."""
        if not state or not state.get("explanation"):
            return []
        tokens = state["explanation"].tokens
        return highlight(tokens, min(max(int(word), 1), len(tokens)) - 1)

    def select_word(state, evt: gr.SelectData):
        """A click on a word of the probability-coloured caption: its number (spaces are entries too)."""
        index = evt.index if isinstance(evt.index, int) else evt.index[0]
        return gr.Slider(value=index // 2 + 1)

    def compare(image, beam_size, left, right):
        rows, texts, notices = [], [], []
        try:  # both checkpoints queued at once: they run side by side in the batcher
            jobs = [_submit(image, beam_size, offered(name), True) for name in (left, right)]
            results = [future.result() for _, _, future in jobs]
        except gr.Error:
            raise
        except Exception as e:  # noqa: BLE001 - _user_error re-raises what is not the user's doing
            raise _user_error(e, image) from None
        for side, name, explanation in zip(("Left", "Right"), (left, right), results):
            texts.append(probability_words(explanation.tokens, explanation.word_probs, explanation.truncated))
            if explanation.in_domain is False:  # the same domain check as the Explore tab, per checkpoint
                notices.append((f"{side} ({name})", out_of_domain_notice(MODELS.get(resolve(name)[1]))))
        if len(notices) == 2 and notices[0][1] == notices[1][1]:
            notices = [(f"Both ({left}, {right})", notices[0][1])]
        a, b = results
        for i in range(max(len(a.tokens), len(b.tokens))):
            rows.append([i + 1,
                         a.tokens[i] if i < len(a.tokens) else "", round(a.word_probs[i], 3) if i < len(a.tokens) else None,
                         b.tokens[i] if i < len(b.tokens) else "", round(b.word_probs[i], 3) if i < len(b.tokens) else None])
        return "\n\n".join(f"{sides}: {notice}" for sides, notice in notices), texts[0], texts[1], rows

    def tell(image, beam_size, checkpoint, boxes):  # the Point and tell tab (captioner.app.regions)
        return explain_json(image, beam_size, offered(checkpoint), boxes, with_alphas=True)

    # regions need PyTorch: where every checkpoint runs on ONNX Runtime, the Point and tell tab is left out
    steerable = any(MODELS.runtime_of(folder) == "torch" for folder in served.values())
    handlers = Handlers(caption=caption, explain=explain_api, explore=run_ui, show_word=show_word,
                        select_word=select_word, compare=compare, model_card=model_card, downloads=downloads,
                        tell=tell if steerable else None)
    note = "" if steerable else ("This server runs exported models on ONNX Runtime: Point and tell (captions "
                                 "steered by regions) needs the PyTorch route and is not offered here.")
    return page(choices, default, other, examples, handlers, _image_input, note=note)


def private_folders() -> list[Path]:
    """Folders never named to a user, even in Gradio's own messages: the working directory, the repository, the
    checkpoints and examples, the home and temporary folders."""
    import captioner

    folders = [Path.cwd(), Path(captioner.__file__).resolve().parents[1], Path.home(), Path(tempfile.gettempdir()),
               checkpoints_dir(), *SERVED.values()]
    return [f for f in folders if str(f) != os.sep]


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int = 7860, prevent_thread_lock: bool = False,
           examples_dir: str | Path | None = None):
    """Start the server with this app's limits (local only, no share link, no SSR, bounded request bodies)."""
    from starlette.middleware import Middleware

    allowed = [str(STORE.folder)] + ([str(examples_dir)] if examples_dir else [])
    # every file Gradio hands out is a copy in its cache folder (or an overlay in the store): served by opaque name
    registry = FileRegistry([GRADIO_CACHE, STORE.folder], private=private_folders())
    return demo.launch(server_name=host, server_port=port, share=False, ssr_mode=False,
                       max_file_size=MAX_UPLOAD_BYTES, state_session_capacity=SESSIONS, allowed_paths=allowed, prevent_thread_lock=prevent_thread_lock,
                       show_error=True, footer_links=["api"],
                       app_kwargs={"middleware": [Middleware(Health, state=STATE),
                                                  Middleware(BodySizeLimit, max_bytes=MAX_BODY_BYTES),
                                                  Middleware(RestApi, explain=rest_explain),
                                                  Middleware(UploadQuota, folder=GRADIO_CACHE,
                                                             max_bytes=MAX_CACHE_BYTES),
                                                  Middleware(OpaqueFiles, registry=registry)]})


# ---- command line ----------------------------------------------------------------------------------------------------


def served_checkpoints(args: argparse.Namespace) -> dict[str, Path]:
    """{short name: folder} from the flags; each folder loaded fully now, so a broken one stops the start."""
    kind = runtime()
    marker = "a runtime.json, written by captioner-export onnx" if kind == "onnx" else "a config.json"
    folders: list[Path] = []
    given: list[str] = []
    for text in args.checkpoint or []:
        folders.append(Path(text))
        given.append(text)
    for root in args.checkpoints_dir or []:
        found = find_checkpoints(root, kind)
        if not found:
            raise CheckpointError(f"--checkpoints-dir {root}: no checkpoint folder (one with {marker}) in it.")
        folders += found
        given += [str(f) for f in found]
    if not folders:
        root = checkpoints_dir()
        folders = soft_first(find_checkpoints(root, kind))
        given = [str(f) for f in folders]
        if not folders:
            todo = "export one (captioner-export onnx CHECKPOINT exported/NAME)" if kind == "onnx" else "train one"
            raise CheckpointError(f"no checkpoint found (no folder with {marker} under {root}); "
                                  f"{todo} or pass --checkpoint FOLDER.")
    names = short_names(folders, given)
    for name, path in names.items():
        try:
            # everything (config, vocabulary, weights, finite outputs) now, in the model's thread (see _run_batch)
            BATCHER.call(lambda: smoke_test(MODELS.get(path)))
        except Exception as e:  # noqa: BLE001 - any failure here means the app cannot serve this checkpoint
            reason = user_message(e) or f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            raise CheckpointError(f"checkpoint {name} cannot be served: {reason}") from e
    return names


def drain_on_sigterm(state: ServerState = STATE, drain_s: float = DRAIN_S) -> None:
    """On SIGTERM: refuse new work (503), let the requests in flight finish (at most ``drain_s``), then stop the
    server (``main`` closes it and exits 0)."""
    def handler(signum, frame):
        state.draining = True
        finished = state.wait_idle(drain_s)
        print(f"SIGTERM: {'requests finished' if finished else f'requests still running after {drain_s:g} s'}; "
              "stopping.", file=sys.stderr, flush=True)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def main(args: argparse.Namespace) -> int:
    from captioner.serving.memory import MemoryTrimmer

    global THREADS
    THREADS = getattr(args, "threads", None)
    MODELS.runtime = getattr(args, "runtime", None) or default_runtime()
    names = served_checkpoints(args)
    examples = example_images(args.examples, prefix="") if args.examples else None
    demo = build_demo(names, examples=examples)
    drain_on_sigterm()
    MemoryTrimmer().start()  # freed memory back to the system every few seconds: the resident size levels off
    try:
        launch(demo, host=args.host, port=args.port,
               examples_dir=args.examples or EXAMPLES_DIR or default_examples_dir())
    except KeyboardInterrupt:
        if not STATE.draining:  # Ctrl-C: as before, "interrupted"
            raise
        demo.close()  # SIGTERM, after the requests in flight: a clean stop
    return 0


def cli() -> int:
    return run(main, get_args_parser(), prog=PROG)


if __name__ == "__main__":
    sys.exit(cli())
