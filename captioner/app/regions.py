"""The explorer's "Point and tell" tab: draw boxes on the uploaded image (two clicks each) or paint areas with a
brush (each one added with "Add painted area"), all numbered in drawing order; press "Tell me about these" and read
a caption whose phrases are coloured by the region they describe (``captioner.decoding.regions``; the /explain API takes the
same boxes as ``regions``; a painted area is a mask, which only the tab sends).

The pictures and the click logic are pure functions here; the one handler that runs the model (``tell``: image,
beam size, checkpoint, boxes -> the /explain answer) comes from ``captioner.commands.app``, beside its state.
"""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr
import numpy as np
from PIL import Image

from captioner.errors import CaptionerError
from captioner.app.region_pictures import REGION_COLOURS, draw_boxes
from captioner.decoding.regions import MAX_REGIONS
from captioner.serving.inputs import load_picture
from captioner.viz import word_overlays

SHOWN_SIDE = (480, 1024)  # the picture is drawn with its long side in this range (clicks are mapped back)
MIN_SIDE = 2  # pixels of the picture: a box narrower than this is a double click, not a box
HINT = ("Click two opposite corners of each box, or paint over an area below and press **Add painted area**; "
        "regions are numbered in the order you add them. Then press "
        "**Tell me about these**: one region gives a caption of what is in it, several give one phrase per region, "
        "in order.")
PAINTED = 0.5  # a painted layer's opacity (0..1) from which a pixel counts as fully in the region


def empty() -> dict:
    """The tab's state: the regions in drawing order (boxes in the picture's pixels, painted masks (H, W) 0..1 of
    its size), a first corner waiting for its second, the drawing scale."""
    return {"boxes": [], "corner": None, "scale": 1.0}


def shown_scale(size: tuple[int, int]) -> float:
    long_side = max(size)
    return min(max(long_side, SHOWN_SIDE[0]), SHOWN_SIDE[1]) / long_side


def draw(picture: Image.Image, state: dict) -> Image.Image:
    """The picture at its drawing scale with every box (numbered, in its colour) and a waiting corner marked."""
    return draw_boxes(picture, state["boxes"], state["scale"], state["corner"])


def _picture(image, quiet: bool = False) -> Image.Image | None:
    """The uploaded picture (None: none). One that cannot be read is an error, or None when ``quiet`` (a new
    upload: the Explore tab says what is wrong with it, and a second message here would hide that one)."""
    if image is None:
        return None
    try:
        return load_picture(image)
    except CaptionerError:
        if quiet:
            return None
        raise gr.Error("this image cannot be read; upload another one on the Explore tab.", print_exception=False)


def start(image) -> tuple[Image.Image | None, dict, list, str]:
    """A new image (or a cleared one): no regions; (canvas, state, coloured caption, caption)."""
    picture = _picture(image, quiet=True)
    state = empty()
    if picture is None:
        return None, state, [], ""
    state["scale"] = shown_scale(picture.size)
    return draw(picture, state), state, [], ""


def brush_canvas(image) -> Image.Image | None:
    """What the brush paints on: the picture at its drawing scale (the paint is mapped back to its pixels)."""
    picture = _picture(image, quiet=True)
    return None if picture is None else draw(picture, {**empty(), "scale": shown_scale(picture.size)})


def painted_mask(painted: dict | None, size: tuple[int, int]) -> np.ndarray | None:
    """The area painted in an image editor's value (``gr.ImageEditor``, numpy: its ``layers`` RGBA arrays) as a
    mask (H, W) of the (W, H) picture, float32 0..1; None when nothing is painted."""
    layers = [np.asarray(layer) for layer in (painted or {}).get("layers") or []]
    paint = [layer[..., 3] for layer in layers if layer.ndim == 3 and layer.shape[2] == 4]
    if not paint:
        return None
    alpha = np.max(np.stack(paint), axis=0).astype(np.float32) / 255  # (h, w) at the drawing scale
    mask = Image.fromarray((alpha * 255).astype(np.uint8)).resize(size, Image.Resampling.BILINEAR)
    mask = np.clip(np.asarray(mask, dtype=np.float32) / 255 / PAINTED, 0.0, 1.0)  # (H, W)
    return mask if mask.any() else None


def add_painted(image, state: dict, painted: dict | None) -> tuple[Image.Image | None, dict]:
    """The painted area becomes the next region (a mask); (canvas, state)."""
    picture = _picture(image)
    if picture is None:
        raise gr.Error("upload an image on the Explore tab first.", print_exception=False)
    state = {**(state or empty()), "scale": shown_scale(picture.size)}
    mask = painted_mask(painted, picture.size)
    if mask is None:
        gr.Warning("paint over an area with the brush first.")
    elif len(state["boxes"]) >= MAX_REGIONS:
        gr.Warning(f"at most {MAX_REGIONS} regions; press Clear to start again.")
    else:
        state["boxes"] = [*state["boxes"], mask]
    return draw(picture, state), state


def click(image, state: dict, point: tuple[float, float]) -> tuple[Image.Image | None, dict]:
    """A click at ``point`` (pixels of the drawn picture): the first corner of a box, or its second."""
    picture = _picture(image)
    if picture is None:
        raise gr.Error("upload an image on the Explore tab first.", print_exception=False)
    state = {**(state or empty()), "scale": shown_scale(picture.size)}
    scale = state["scale"]
    x = min(max(point[0] / scale, 0.0), float(picture.width))
    y = min(max(point[1] / scale, 0.0), float(picture.height))
    if state["corner"] is None:
        if len(state["boxes"]) >= MAX_REGIONS:
            gr.Warning(f"at most {MAX_REGIONS} regions; press Clear to start again.")
        else:
            state["corner"] = [x, y]
    else:
        (cx, cy), state["corner"] = state["corner"], None
        box = [min(cx, x), min(cy, y), max(cx, x), max(cy, y)]
        if box[2] - box[0] >= MIN_SIDE and box[3] - box[1] >= MIN_SIDE:
            state["boxes"] = [*state["boxes"], [round(v, 1) for v in box]]
    return draw(picture, state), state


def coloured(answer: dict) -> list[tuple[str, str | None]]:
    """The caption as (phrase, box number) pairs for a highlighted text: each run of words of one box together,
    words of no box (None) apart, single spaces between the runs."""
    pairs: list[tuple[str, str | None]] = []
    regions = answer.get("regions") or [-1] * len(answer["tokens"])
    for word, region in zip(answer["tokens"], regions):
        label = str(region + 1) if region >= 0 else None
        if pairs and pairs[-1][1] == label:
            pairs[-1] = (f"{pairs[-1][0]} {word}", label)
        else:
            pairs += [(" ", None), (word, label)] if pairs else [(word, label)]
    return pairs


def word_maps(picture: Image.Image, boxes: list, answer: dict) -> list[tuple[Image.Image, str]]:
    """Each word's attention (the answer's ``alphas``, T x h x w) on the picture with its regions drawn."""
    alphas = np.asarray(answer.get("alphas") or [], dtype=np.float32)
    if not len(alphas):
        return []
    return word_overlays(draw_boxes(picture, boxes), answer["tokens"], alphas)


def regions_tab(image: gr.Image, beam: gr.Slider, checkpoint: gr.Dropdown, tell: Callable) -> None:
    """The tab's components and events (inside a ``gr.Tab``); ``image``, ``beam`` and ``checkpoint`` are the
    Explore tab's. ``tell(image, beam size, checkpoint, boxes)`` returns the /explain answer."""
    gr.Markdown(HINT)
    state = gr.State(empty())
    with gr.Row():
        with gr.Column(scale=3):
            canvas = gr.Image(label="Regions: draw boxes here (click two corners each)", type="pil",
                              interactive=False, format="png", elem_id="regions-canvas")
            brush = gr.ImageEditor(label="Or paint an area, then press Add painted area", type="numpy",
                                   image_mode="RGBA", sources=(), transforms=(), layers=False, format="png",
                                   brush=gr.Brush(colors=[("#000000", 0.6)], color_mode="fixed"),
                                   elem_id="regions-brush")
            add = gr.Button("Add painted area", elem_id="regions-add")
        with gr.Column(scale=2):
            with gr.Row():
                ask = gr.Button("Tell me about these", variant="primary", elem_id="regions-tell")
                clear = gr.Button("Clear", elem_id="regions-clear")
            text = gr.Textbox(label="Caption", interactive=False, elem_id="regions-text")
            colours = {str(n): c for n, c in enumerate(REGION_COLOURS, 1)}
            phrases = gr.HighlightedText(label="Caption, each phrase in the colour of its box", color_map=colours,
                                         show_legend=True, elem_id="regions-phrases")
    gallery = gr.Gallery(label="Attention per word (the regions drawn on it)", columns=6, height="auto",
                         object_fit="contain", interactive=False, elem_id="regions-overlays")

    def on_click(image, state, evt: gr.SelectData):
        return click(image, state, (float(evt.index[0]), float(evt.index[1])))

    def on_tell(image, beam_size, checkpoint, state):
        boxes = (state or {}).get("boxes") or []
        if not boxes:
            raise gr.Error("mark at least one region first: click two opposite corners on the picture, or paint "
                           "an area and press Add painted area.", print_exception=False)
        answer = tell(image, beam_size, checkpoint, boxes)
        return answer["text"], coloured(answer), word_maps(_picture(image), boxes, answer)

    def on_start(image):
        return *start(image), [], brush_canvas(image)

    def on_add(image, state, painted):
        return *add_painted(image, state, painted), brush_canvas(image)  # the brush starts afresh

    outputs = [canvas, state, phrases, text, gallery, brush]
    image.change(on_start, [image], outputs, api_name=False)
    clear.click(on_start, [image], outputs, api_name=False)
    canvas.select(on_click, [image, state], [canvas, state], api_name=False)
    add.click(on_add, [image, state, brush], [canvas, state, brush], api_name=False)
    ask.click(on_tell, [image, beam, checkpoint, state], [text, phrases, gallery], api_name=False)
