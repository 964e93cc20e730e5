"""The app's Point and tell: boxes drawn by clicks, the caption coloured by box, and /explain with regions (the
tiny random checkpoint of test_app; the browser test with a shipped checkpoint is in test_browser_regions.py)."""

import numpy as np
import pytest
from PIL import Image

import app
from captioner.app import regions as R
from captioner.commands.app import MODELS
from captioner.decoding.regions import MAX_REGIONS, region_weights
from captioner.serving import explain
from test_app import HTTPX, make_checkpoint, make_images, running_app


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("app_regions")
    return {"checkpoint": make_checkpoint(root / "ckpt"), "images": make_images(root / "images")}


def test_two_clicks_make_a_box_in_the_pictures_pixels(files):
    image = files["images"][0]  # 160 x 128: drawn with its long side at 480
    canvas, state, phrases, text = R.start(str(image))
    assert canvas.size == (480, 384) and state["boxes"] == [] and phrases == [] and text == ""
    scale = state["scale"]
    canvas, state = R.click(str(image), state, (30 * scale, 40 * scale))
    assert state["corner"] == [30, 40] and state["boxes"] == []
    canvas, state = R.click(str(image), state, (10 * scale, 90 * scale))  # any two opposite corners
    assert state["boxes"] == [[10, 40, 30, 90]] and state["corner"] is None
    canvas, state = R.click(str(image), state, (999 * scale, -5 * scale))  # clamped to the picture
    canvas, state = R.click(str(image), state, (100 * scale, 100 * scale))
    assert state["boxes"][1] == [100, 0, 160, 100]
    # the boxes are drawn in their colours: box 1's outline is red-ish on the white picture
    pixel = np.asarray(canvas)[round(60 * scale), round(10 * scale)]
    assert pixel[0] > 150 and pixel[1] < 100
    # a double click is not a box
    for _ in range(2):
        canvas, state = R.click(str(image), state, (50 * scale, 50 * scale))
    assert len(state["boxes"]) == 2


def test_a_bad_upload_leaves_the_canvas_empty_without_a_second_message(tmp_path):
    bad = tmp_path / "not_an_image.png"
    bad.write_text("text")
    assert R.start(str(bad))[0] is None  # the Explore tab reports it
    with pytest.raises(Exception, match="cannot be read"):
        R.click(str(bad), R.empty(), (1.0, 1.0))


def test_at_most_the_regions_a_caption_holds(files):
    image = str(files["images"][0])
    _, state, _, _ = R.start(image)
    for i in range(MAX_REGIONS):
        for point in ((i * 10, 0), (i * 10 + 8, 8)):
            _, state = R.click(image, state, tuple(v * state["scale"] for v in point))
    with pytest.warns(UserWarning, match="at most"):
        _, state = R.click(image, state, (150 * state["scale"], 100 * state["scale"]))
    assert len(state["boxes"]) == MAX_REGIONS and state["corner"] is None


def test_phrases_take_their_boxs_number():
    answer = {"tokens": ["a", "picture", "of", "a", "red", "circle", "a", "blue", "square"],
              "regions": [-1, -1, -1, 0, 0, 0, 1, 1, 1]}
    pairs = R.coloured(answer)
    assert [(w, label) for w, label in pairs if w != " "] == [("a picture of", None), ("a red circle", "1"),
                                                             ("a blue square", "2")]
    assert "".join(w for w, _ in pairs) == " ".join(answer["tokens"])
    assert R.coloured({"tokens": ["a", "b"]}) == [("a b", None)]  # not steered: one plain run


def test_word_maps_show_each_words_attention_with_the_boxes(files):
    image = files["images"][0]
    answer = {"tokens": ["a", "red"], "alphas": np.full((2, 7, 7), 1 / 49).tolist()}
    maps = R.word_maps(Image.open(image), [[0, 0, 40, 40]], answer)
    assert [label for _, label in maps] == ["1: a", "2: red"] and maps[0][0].size == (224, 179)
    assert R.word_maps(Image.open(image), [], {"tokens": []}) == []


def test_explain_with_one_region_looks_inside_it(files):
    image = files["images"][0]
    app.build_demo([files["checkpoint"]])
    plain = app.explain_json(str(image), 3, "ckpt")
    assert "regions" not in plain
    box = [0, 0, 40, 64]  # the left quarter, top half of the 160 x 128 image
    answer = app.explain_json(str(image), 3, "ckpt", "[0, 0, 40, 64]")
    assert answer["regions"] == [0] * len(answer["tokens"])
    assert app.explain_json(str(image), 3, "ckpt", [box])["text"] == answer["text"]  # a list, or its JSON
    model = MODELS.get(files["checkpoint"])
    outside = region_weights(box, model.grid, Image.open(image).size) == 0
    explanation, _ = explain(model, str(image), 3, [box])
    assert np.abs(explanation.alphas.reshape(len(explanation.tokens), -1)[:, outside]).max() == 0
    assert np.abs(explain(model, str(image), 3)[0].alphas.reshape(len(explanation.tokens), -1)[:, outside]).max() > 0


@pytest.mark.parametrize("regions, message", [("[0, 0, 40", "JSON"), ("[[0, 0, 400, 400], [1, 1, 2, 2]]", "one"),
                                              ("[500, 500, 600, 600]", "outside"), ("{}", "list of boxes")])
def test_explain_refuses_bad_regions_in_one_sentence(files, regions, message):
    app.build_demo([files["checkpoint"]])
    with pytest.raises(Exception, match=message) as caught:
        app.explain_json(str(files["images"][0]), 3, "ckpt", regions)
    assert type(caught.value).__name__ == "Error" and str(files["checkpoint"]) not in str(caught.value)


def test_the_explain_regions_endpoint(files, tmp_path):
    from gradio_client import Client, handle_file

    image = files["images"][0]
    with running_app(files["checkpoint"], tmp_path / "overlays") as url:
        client = Client(url, download_files=str(tmp_path), verbose=False, httpx_kwargs=dict(HTTPX))
        steered = client.predict(handle_file(str(image)), 3, "ckpt", "[0, 0, 40, 64]", api_name="/explain_regions")
        plain = client.predict(handle_file(str(image)), 3, "ckpt", "", api_name="/explain_regions")
        old = client.predict(handle_file(str(image)), 3, api_name="/explain")  # three inputs, as before
    assert steered == app.explain_json(str(image), 3, "ckpt", [0, 0, 40, 64]) | {"checkpoint": "ckpt"}
    assert steered["regions"] == [0] * len(steered["tokens"])
    assert plain == old and "regions" not in old


def painted(shown: tuple[int, int], area: tuple[int, int, int, int]) -> dict:
    """An image editor's value (gr.ImageEditor, numpy, RGBA) with ``area`` (x0, y0, x1, y1 of the drawn picture)
    painted with the tab's brush: black at 0.6 opacity in the layer's alpha channel."""
    layer = np.zeros((shown[1], shown[0], 4), dtype=np.uint8)  # (h, w, RGBA)
    x0, y0, x1, y1 = area
    layer[y0:y1, x0:x1, 3] = round(0.6 * 255)
    return {"background": None, "layers": [layer], "composite": None}


def test_a_painted_area_becomes_a_mask_region_numbered_in_drawing_order(files):
    image = str(files["images"][0])  # 160 x 128, drawn at scale 3
    canvas, state, _, _ = R.start(image)
    scale = state["scale"]
    _, state = R.click(image, state, (100 * scale, 0))
    _, state = R.click(image, state, (160 * scale, 64 * scale))
    canvas, state = R.add_painted(image, state, painted(canvas.size, (0, 0, round(40 * scale), round(64 * scale))))
    box, mask = state["boxes"]
    assert box == [100, 0, 160, 64] and mask.shape == (128, 160) and mask.dtype == np.float32
    assert mask[:60, :38].min() == 1 and mask[70:, :].max() == 0 and mask[:, 45:].max() == 0
    # the painted area is tinted in region 2's colour (green) on the white picture; outside it stays white
    assert tuple(np.asarray(canvas)[round(40 * scale), round(20 * scale)]) != (255, 255, 255)
    assert np.asarray(canvas)[round(40 * scale), round(20 * scale)][1] > np.asarray(canvas)[round(40 * scale),
                                                                                             round(20 * scale)][0]
    assert tuple(np.asarray(canvas)[round(100 * scale), round(20 * scale)]) == (255, 255, 255)
    with pytest.warns(UserWarning, match="paint over an area"):  # nothing painted: no region
        _, same = R.add_painted(image, state, painted(canvas.size, (0, 0, 0, 0)))
    assert len(same["boxes"]) == 2


def test_a_painted_mask_steers_the_caption_like_a_box(files):
    image = files["images"][0]
    app.build_demo([files["checkpoint"]])
    canvas, state, _, _ = R.start(str(image))
    scale = state["scale"]
    _, state = R.add_painted(str(image), state, painted(canvas.size, (0, 0, round(40 * scale), round(64 * scale))))
    (mask,) = state["boxes"]
    answer = app.explain_json(str(image), 3, "ckpt", state["boxes"], with_alphas=True)  # the tab's ``tell``
    assert answer["regions"] == [0] * len(answer["tokens"])
    assert answer["text"] == app.explain_json(str(image), 3, "ckpt", [0, 0, 40, 64])["text"]  # the same area
    model = MODELS.get(files["checkpoint"])
    outside = region_weights(mask, model.grid, Image.open(image).size) == 0
    alphas = np.asarray(answer["alphas"]).reshape(len(answer["tokens"]), -1)
    assert outside.any() and np.abs(alphas[:, outside]).max() == 0
    assert len(R.word_maps(Image.open(image), state["boxes"], answer)) == len(answer["tokens"])


def test_a_mask_comes_from_python_only_never_from_json():
    from captioner.serving.inputs import parse_regions

    mask = np.ones((4, 5), dtype=np.float32)
    assert parse_regions(mask)[0] is mask and parse_regions([[0, 0, 2, 2], mask])[1] is mask
    assert parse_regions("[[0, 0, 2, 2]]") == [[0, 0, 2, 2]]
