"""Point and tell in a real browser: upload a scene, draw two boxes (or paint one area and draw one box) on the Point
and tell tab, ask, and read a caption that names the two objects in the order the regions were marked (the shipped
soft checkpoint; integration tier)."""

import json
from pathlib import Path

import pytest

from test_browser import browser, open_page, page  # noqa: F401 - fixtures
from test_app import running_app


def loaded_widths(page, selector: str, count: int) -> list[int]:
    """naturalWidth of every <img> under ``selector``, once ``count`` of them have finished loading."""
    page.wait_for_function(f"n => {{ const imgs = [...document.querySelectorAll('{selector} img')];"
                           " return imgs.length >= n && imgs.every(i => i.complete); }", arg=count, timeout=60_000)
    return page.eval_on_selector_all(f"{selector} img", "imgs => imgs.map(i => i.naturalWidth)")



def draw_box(page, bbox, scale: float) -> None:
    """Two clicks on the canvas, just inside the corners of ``bbox`` (scene pixels shown at ``scale``)."""
    x0, y0, x1, y1 = bbox
    click_at(page, x0 * scale + 1, y0 * scale + 1)
    click_at(page, x1 * scale - 1, y1 * scale - 1)


def tell(page) -> tuple[str, list[tuple[str, str]]]:
    """Press "Tell me about these": (the caption, the (colour, shape) of each object it names, in order)."""
    from captioner.scenes.metrics import parse_phrases

    page.locator("#regions-tell").click()
    page.wait_for_function("() => { const t = document.querySelector('#regions-text textarea');"
                           " return t && t.value.length > 0; }", timeout=60_000)
    caption = page.locator("#regions-text textarea").input_value()
    return caption, [(p.key[1], p.key[2]) for p in parse_phrases(caption.split())]

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = ROOT / "checkpoints" / "shapes-soft"
    with running_app({"shapes-soft": checkpoint}, tmp_path_factory.mktemp("overlays")) as url:
        yield url


def two_object_scene(shapes_json: Path) -> tuple[Path, list[dict]]:
    """The first scene with exactly two objects of different colours and shapes."""
    for record in json.loads(shapes_json.read_text())["images"]:
        objects = record["objects"]
        if len(objects) == 2 and len({o["color"] for o in objects}) == 2 and len({o["shape"] for o in objects}) == 2:
            return shapes_json.parent / record.get("filepath", "") / record["filename"], objects
    pytest.skip("no two-object scene in the generated data")


def click_at(page, x: float, y: float) -> None:
    """A click on the canvas at (x, y) pixels of the picture it shows, once that picture has been redrawn."""
    img = page.locator("#regions-canvas img")
    before = img.get_attribute("src")
    size = page.eval_on_selector("#regions-canvas img", "i => [i.naturalWidth, i.clientWidth]")
    img.click(position={"x": x * size[1] / size[0], "y": y * size[1] / size[0]})
    page.wait_for_function("src => { const i = document.querySelector('#regions-canvas img');"
                           " return i && i.complete && i.naturalWidth > 0 && i.src !== src; }", arg=before,
                           timeout=30_000)


def test_two_boxes_are_told_in_drawing_order(page, shapes_json):  # noqa: F811
    image, objects = two_object_scene(shapes_json)
    drawn = objects[::-1]  # not the scene's own order
    page.locator("input[type=file]").first.set_input_files(str(image))
    page.get_by_role("tab", name="Point and tell").click()
    page.wait_for_function("() => { const i = document.querySelector('#regions-canvas img');"
                           " return i && i.complete && i.naturalWidth > 0; }", timeout=60_000)
    natural = page.eval_on_selector("#regions-canvas img", "i => i.naturalWidth")
    scale = natural / 224  # the generated scenes are 224 x 224
    for obj in drawn:
        draw_box(page, obj["bbox"], scale)
    caption, named = tell(page)
    assert named == [(o["color"], o["shape"]) for o in drawn], caption
    legend = page.locator("#regions-phrases").inner_text()
    assert "1" in legend and "2" in legend
    widths = loaded_widths(page, "#regions-overlays", len(caption.split()))  # each word's attention
    assert len(widths) == len(caption.split()) and all(w > 0 for w in widths)


def paint(page, box: list[int], side: int = 224) -> None:
    """Brush strokes across ``box`` (pixels of the side x side scene) on the image editor's canvas, which shows the
    picture (drawn at its long side, naturalWidth of the boxes' canvas) centred at the zoom it displays."""
    x, y, w, h = page.eval_on_selector("#regions-brush canvas", "c => { const r = c.getBoundingClientRect();"
                                       " return [r.x, r.y, r.width, r.height]; }")
    zoom = float(page.locator("#regions-brush").inner_text().split()[-1].rstrip("%")) / 100
    shown = page.eval_on_selector("#regions-canvas img", "i => i.naturalWidth") * zoom
    scale = shown / side
    left, top = x + (w - shown) / 2, y + (h - shown) / 2
    x0, y0, x1, y1 = box
    for row in range(y0 + 3, y1 - 2, 6):
        page.mouse.move(left + (x0 + 3) * scale, top + row * scale)
        page.mouse.down()
        page.mouse.move(left + (x1 - 3) * scale, top + row * scale, steps=8)
        page.mouse.up()


def test_a_painted_area_and_a_box_are_told_in_drawing_order(page, shapes_json):  # noqa: F811
    image, objects = two_object_scene(shapes_json)
    page.locator("input[type=file]").first.set_input_files(str(image))
    page.get_by_role("tab", name="Point and tell").click()
    page.wait_for_function("() => { const i = document.querySelector('#regions-canvas img');"
                           " return i && i.complete && i.naturalWidth > 0; }", timeout=60_000)
    page.locator("#regions-brush canvas").first.wait_for(timeout=30_000)
    scale = page.eval_on_selector("#regions-canvas img", "i => i.naturalWidth") / 224
    painted, boxed = objects[1], objects[0]  # not the scene's own order
    paint(page, painted["bbox"])
    before = page.locator("#regions-canvas img").get_attribute("src")
    page.locator("#regions-add").click()
    page.wait_for_function("src => { const i = document.querySelector('#regions-canvas img');"
                           " return i && i.complete && i.src !== src; }", arg=before, timeout=30_000)
    draw_box(page, boxed["bbox"], scale)
    caption, named = tell(page)
    assert named == [(o["color"], o["shape"]) for o in (painted, boxed)], caption
