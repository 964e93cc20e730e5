"""The Gradio app: predict() without a server, the /caption API through gradio_client, bad uploads, concurrency."""

import hashlib
import socket
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

import app
from captioner import Captioner, ModelConfig
from captioner.decoding.config import DecodingConfig
from captioner.commands import app as app_impl
from captioner.app import views as app_views
from captioner.checkpoints.folder import save_checkpoint
from captioner.serving import OverlayStore, check_beam_size, find_checkpoints, highlight
from captioner.vocab import Vocabulary

WORDS = 6  # the tiny model always writes this many words (see make_checkpoint)
# gradio_client uploads with httpx's default 5 s timeout; on 2 busy cores one upload took longer (a CI run beside
# training jobs): every Client here waits up to a minute instead
HTTPX = {"timeout": 60.0}


# ---- helpers shared with test_browser.py ---------------------------------------------------------------

def make_checkpoint(folder: Path) -> Path:
    """A tiny random model whose captions are always WORDS words long, with peaked (distinct) attention."""
    torch.manual_seed(0)
    vocab = Vocabulary("a red blue green circle square triangle small large".split())
    cfg = ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=32, embed_dim=16, attention_dim=16)
    model = Captioner(cfg, vocab, decoding=DecodingConfig(max_len=WORDS)).eval()
    with torch.no_grad():
        model.decoder.L_o.bias[vocab.end_index] = -1e4  # never stop early: every caption has WORDS words
        for p in model.decoder.attention.parameters():
            p.mul_(30)  # random attention is nearly uniform; sharpen it so each word's overlay differs
    return save_checkpoint(model, folder)


def make_images(folder: Path) -> list[Path]:
    """Two small scenes (a red circle, a blue square) as PNG and JPEG."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, colour, box, shape in [("circle.png", "red", (20, 30, 90, 100), "ellipse"),
                                     ("square.jpg", "blue", (60, 10, 120, 70), "rectangle")]:
        image = Image.new("RGB", (160, 128), "white")
        getattr(ImageDraw.Draw(image), shape)(box, fill=colour)
        image.save(folder / name)
        paths.append(folder / name)
    return paths


def make_bad_files(folder: Path) -> tuple[Path, Path]:
    """A text file named .png, and a 20000x20000 PNG (~50 kB on disk, 400 megapixels decoded)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = folder / "not_an_image.png"
    text.write_text("this is not an image\n")
    bomb = folder / "bomb.png"
    Image.new("1", (20000, 20000)).save(bomb)
    return text, bomb


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_app(checkpoints: Path | dict[str, Path], cache: Path, examples: list[Path] | None = None,
                store: OverlayStore | None = None):
    """The app on a free local port in this process (one checkpoint folder, or {short name: folder}); yields its URL."""
    old_store, app_impl.STORE = app_impl.STORE, store or OverlayStore(cache)
    demo = app.build_demo(checkpoints if isinstance(checkpoints, dict) else [checkpoints],
                          examples=examples or [])
    try:
        _, url, _ = app.launch(demo, port=free_port(), prevent_thread_lock=True, examples_dir=cache)
        yield url.rstrip("/")
    finally:
        demo.close()
        app_impl.STORE = old_store


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ---- fixtures -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("app")
    return {"checkpoint": make_checkpoint(root / "ckpt"), "images": make_images(root / "images"),
            "bad": make_bad_files(root / "bad"), "cache": root / "overlays"}


@pytest.fixture(scope="module")
def server(files):
    with running_app(files["checkpoint"], files["cache"]) as url:
        yield url


@pytest.fixture
def client(server, tmp_path):
    from gradio_client import Client

    return Client(server, download_files=str(tmp_path), verbose=False, httpx_kwargs=dict(HTTPX))


@pytest.fixture(scope="module")
def expected(files):
    """predict() called directly: what every API answer must equal."""
    return {(str(path), beam): app.predict(str(path), beam, str(files["checkpoint"]))
            for path in files["images"] for beam in (1, 3)}


# ---- predict() without a server -----------------------------------------------------------------------------

def test_predict_returns_one_overlay_per_word(files, expected):
    text, overlays = expected[(str(files["images"][0]), 3)]
    words = text.split()
    assert len(words) == WORDS and len(overlays) == WORDS
    for i, ((path, label), word) in enumerate(zip(overlays, words), start=1):
        assert label == f"{i}: {word}"
        with Image.open(path) as image:
            # JPEG thumbnails: PNG encoding was most of the round trip's own work
            assert image.format == "JPEG" and max(image.size) == 224 and path.endswith(".jpg")
    assert len({path for path, _ in overlays}) > 1  # the words attend to different places


def test_predict_is_repeatable_and_accepts_pil(files, expected):
    path = files["images"][1]
    again = app.predict(str(path), 3, str(files["checkpoint"]))
    assert again == expected[(str(path), 3)]
    with Image.open(path) as image:
        assert app.predict(image.copy(), 3, str(files["checkpoint"]))[0] == again[0]


@pytest.mark.parametrize("bad", ["not_an_image", "bomb", "missing"])
def test_predict_rejects_bad_files_in_one_sentence(files, bad):
    text, bomb = files["bad"]
    path = {"not_an_image": text, "bomb": bomb, "missing": text.parent / "nope.png"}[bad]
    with pytest.raises(app.gr.Error) as info:
        app.predict(str(path), 3, str(files["checkpoint"]))
    message = str(info.value.message)
    assert "\n" not in message and {"not_an_image": "not an image", "bomb": "too many pixels",
                                    "missing": "not found"}[bad] in message


@pytest.mark.parametrize("beam", [0, 11, 2.5, "x", None])
def test_predict_rejects_bad_beam_sizes(files, beam):
    with pytest.raises(app.gr.Error, match="beam size"):
        app.predict(str(files["images"][0]), beam, str(files["checkpoint"]))


def test_predict_without_image_or_with_unknown_checkpoint(files):
    with pytest.raises(app.gr.Error, match="upload an image"):
        app.predict(None, 3, str(files["checkpoint"]))
    with pytest.raises(app.gr.Error, match="not offered here"):
        app.predict(str(files["images"][0]), 3, "no-such-checkpoint")


def test_word_view_clamps_and_highlights(files, expected):
    text, overlays = expected[(str(files["images"][0]), 3)]
    image, pairs = app.word_view(overlays, text, 2)
    assert image == overlays[1][0]
    assert [w for w, label in pairs if label == "current"] == [text.split()[1]]
    assert "".join(w for w, _ in pairs) == text
    assert app.word_view(overlays, text, 99)[0] == overlays[-1][0]
    assert app.word_view(None, "", 1) == (None, [])
    slider, image, _ = app.reset_word_view(overlays, text)
    assert (slider.minimum, slider.maximum, slider.value, image) == (1, WORDS, 1, overlays[0][0])


def test_helpers(tmp_path):
    assert check_beam_size(3.0) == 3 and check_beam_size("2") == 2
    assert highlight(["a", "b"], 0) == [("a", "current"), (" ", None), ("b", None)]
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    assert find_checkpoints(tmp_path) == [tmp_path / "good"]
    assert find_checkpoints(tmp_path / "absent") == []


def test_overlay_store_is_content_addressed(tmp_path):
    store = OverlayStore(tmp_path)
    red, blue = Image.new("RGB", (8, 8), "red"), Image.new("RGB", (8, 8), "blue")
    first = store.save(red)
    assert store.save(red.copy()) == first and store.save(blue) != first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, store.save(blue).name])  # no temp files


def test_main_needs_a_checkpoint(tmp_path, monkeypatch, capsys):
    from captioner.commands.runner import run

    monkeypatch.setattr(app_impl, "CHECKPOINTS_DIR", tmp_path)
    assert run(app.main, app.get_args_parser(), "captioner-app", []) == 2
    err = capsys.readouterr().err.strip()
    assert "no checkpoint found" in err and "\n" not in err
    assert run(app.main, app.get_args_parser(), "captioner-app", ["--checkpoint", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_build_demo_refuses_no_checkpoints():
    with pytest.raises(app.CaptionerError):
        app.build_demo([])


# ---- the /caption API through a real server --------------------------------------------------------------------

def _check_answer(answer, want):
    text, gallery = answer
    want_text, want_overlays = want
    assert text == want_text
    assert [item["caption"] for item in gallery] == [label for _, label in want_overlays]
    for item, (path, _) in zip(gallery, want_overlays):
        assert same_picture(item["image"], path)


def same_picture(a: str | Path, b: str | Path) -> bool:
    """The same file, or (a caption batched with other clients' images: its α maps differ from the one-image
    run in the last float digits, so a few heat levels and JPEG blocks move) the same picture up to that."""
    import numpy as np

    if sha256(a) == sha256(b):
        return True
    with Image.open(a) as x, Image.open(b) as y:
        if x.size != y.size:
            return False
        diff = np.abs(np.asarray(x.convert("RGB"), np.int16) - np.asarray(y.convert("RGB"), np.int16))
    return float(diff.mean()) < 0.5 and int(diff.max()) <= 24


def test_api_caption(client, files, expected):
    from gradio_client import handle_file

    image = files["images"][0]
    answer = client.predict(handle_file(str(image)), api_name="/caption")  # beam size and checkpoint default
    assert len(answer[1]) == WORDS
    _check_answer(answer, expected[(str(image), 3)])
    _check_answer(client.predict(handle_file(str(image)), 1, api_name="/caption"), expected[(str(image), 1)])


def test_api_refuses_unknown_checkpoint(client, files):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="not in the list of choices"):
        client.predict(handle_file(str(files["images"][0])), 3, "/etc", api_name="/caption")


@pytest.mark.integration
def test_api_serves_eight_clients_at_once(server, files, expected, tmp_path):
    from gradio_client import Client, handle_file

    jobs = [(files["images"][i % 2], 1 + 2 * (i // 2 % 2)) for i in range(8)]  # both images, beam 1 and 3
    answers, errors = [None] * len(jobs), []

    def ask(i):
        try:
            c = Client(server, download_files=str(tmp_path / str(i)), verbose=False, httpx_kwargs=dict(HTTPX))
            answers[i] = c.predict(handle_file(str(jobs[i][0])), jobs[i][1], api_name="/caption")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    for (image, beam), answer in zip(jobs, answers):
        _check_answer(answer, expected[(str(image), beam)])


@pytest.mark.parametrize("bad,message", [("not_an_image", "not an image"), ("bomb", "too many pixels")])
def test_api_bad_upload_is_an_error_and_server_stays_up(client, files, expected, bad, message):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    text, bomb = files["bad"]
    with pytest.raises(AppError, match=message):
        client.predict(handle_file(str(text if bad == "not_an_image" else bomb)), api_name="/caption")
    image = files["images"][1]
    _check_answer(client.predict(handle_file(str(image)), api_name="/caption"), expected[(str(image), 3)])


# ---- /explain, discovery, empty and cut states ------------------------------------------------------------------

def test_api_explain(client, files, expected):
    import math

    from gradio_client import handle_file

    image = files["images"][0]
    answer = client.predict(handle_file(str(image)), 3, api_name="/explain")
    text, _ = expected[(str(image), 3)]
    assert answer["text"] == text and answer["tokens"] == text.split()
    assert answer["checkpoint"] == "ckpt"  # the short name, never the folder
    n = len(answer["tokens"])
    assert len(answer["word_probs"]) == n and all(0 < p <= 1 for p in answer["word_probs"])
    assert len(answer["betas"]) == n and all(0 < b < 1 for b in answer["betas"])
    assert len(answer["entropies"]) == n and all(e >= 0 for e in answer["entropies"])
    assert 1 <= len(answer["nbest"]) <= 3 and answer["nbest"][0]["text"] == text
    assert answer["nbest"] == sorted(answer["nbest"], key=lambda h: -h["score"])  # ranked by the score it shows
    assert all(h["score"] == h["log_prob"] for h in answer["nbest"])  # no length penalty: the score is log_prob
    assert answer["warning"] is None
    # The tiny model never emits <end>: its caption is cut at max_len, and so has no <end> term, so the
    # teacher-forced word probabilities multiply to exactly the beam's sequence probability.
    assert answer["truncated"] is True
    assert math.isclose(sum(math.log(p) for p in answer["word_probs"]), answer["log_prob"], rel_tol=1e-6)
    assert math.isclose(answer["log_prob"], answer["nbest"][0]["log_prob"], rel_tol=1e-9)
    assert answer["in_domain"] in (None, True, False) and set(answer) >= {"domain_score"}
    greedy = client.predict(handle_file(str(image)), 1, api_name="/explain")
    assert len(greedy["nbest"]) == 1 and greedy["text"] == expected[(str(image), 1)][0]


def test_checkpoints_dir_examples_and_soft_first(files, tmp_path):
    import json
    import shutil

    runs = tmp_path / "runs"
    for name in ("zeta", "alpha"):
        shutil.copytree(files["checkpoint"], runs / name)
    config = json.loads((runs / "zeta" / "config.json").read_text())
    assert config["model"]["attention"] == "soft"
    hard = json.loads((runs / "alpha" / "config.json").read_text())
    hard["model"]["attention"] = "hard"
    (runs / "alpha" / "config.json").write_text(json.dumps(hard))
    args = app.get_args_parser().parse_args(["--checkpoint", str(files["checkpoint"]), "--checkpoints-dir", str(runs)])
    assert list(app_impl.served_checkpoints(args)) == ["ckpt", "alpha", "zeta"]  # as given, then by name
    assert app_impl.soft_first([runs / "alpha", runs / "zeta"]) == [runs / "zeta", runs / "alpha"]
    args = app.get_args_parser().parse_args(["--examples", str(files["images"][0].parent)])
    assert args.examples == files["images"][0].parent


def test_cut_caption_is_marked():
    words = app_impl.probability_words(["a", "red"], [0.95, 0.3], truncated=True)
    assert [w for w, _ in words if w.strip()] == ["a", "red", "… (cut at the length limit)"]
    assert [label for w, label in words if w.strip()] == ["sure (p ≥ 0.9)", "unsure (p < 0.5)", "cut"]
    assert app_impl.probability_words(["a"], [0.6], truncated=False) == [("a", "likely (0.5–0.9)")]


def test_large_overlay_keeps_the_image_resolution():
    import numpy as np

    picture = Image.new("RGB", (640, 400), "white")
    sheet = app_impl.large_overlay(picture, np.eye(4, dtype=np.float32), "red")
    assert sheet.height == 400 and sheet.width > 640  # the picture at its own size, the colour bar beside it
    small = app_impl.large_overlay(Image.new("RGB", (160, 128)), np.eye(4, dtype=np.float32), "red")
    assert small.height == round(128 * app_impl.LARGE_MIN_SIDE / 160)  # enlarged, never the 224-px model input
    big = app_impl.large_overlay(Image.new("RGB", (3000, 1500)), np.ones((4, 4), np.float32), "x")
    assert big.height == app_impl.LARGE_SIDE // 2


def test_explain_reports_the_domain_check_when_the_model_has_one(files, monkeypatch):
    class Unlike:  # stands in for captioner.model.domain.DomainCheck: (B, L, C) -> [(in_domain, score)]
        def check(self, annotations):
            return [(False, 42.0)] * annotations.shape[0]

    assert app.explain_json(str(files["images"][0]), 1, str(files["checkpoint"]))["in_domain"] is None
    model = app_impl.MODELS.get(files["checkpoint"])
    monkeypatch.setattr(model, "domain", Unlike(), raising=False)
    answer = app.explain_json(str(files["images"][0]), 1, str(files["checkpoint"]))
    assert answer["in_domain"] is False and answer["domain_score"] == 42.0


def test_word_chart_has_every_series():
    """The chart is an SVG the browser draws: a bar per word for p and for β, the entropy line, the legend."""
    import re
    import xml.etree.ElementTree as ET

    svg = app_impl.word_chart(["a", "red", "<circle>"], [0.9, 0.5, 0.7], [0.2, 0.3, 0.4], [1.0, 2.0, 1.5],
                              chosen=[0.5, 0.6, 0.7])
    root = ET.fromstring(svg)  # well-formed: the word "<circle>" is escaped
    ns = "{http://www.w3.org/2000/svg}"
    assert [r.get("class") for r in root.iter(ns + "rect") if r.get("class")] == ["p", "beta"] * 3
    heights = [float(r.get("height")) for r in root.iter(ns + "rect") if r.get("class") == "p"]
    assert heights[0] > heights[2] > heights[1] > 0  # bars follow p: 0.9 > 0.7 > 0.5
    assert {p.get("class") for p in root.iter(ns + "polyline")} == {"chosen", "entropy"}
    assert [t.text for t in root.iter(ns + "text") if t.get("class") == "legend"] == [
        "p(chosen location)", "p(word)", "β (gate)", "attention entropy"]
    no_gate = ET.fromstring(app_impl.word_chart(["a"], [0.9], None, [1.0]))
    assert [t.text for t in no_gate.iter(ns + "text") if t.get("class") == "legend"] == ["p(word)",
                                                                                        "attention entropy"]
    assert not re.search(r"nan|inf", svg)


def test_overlay_store_saves_png_or_jpeg(tmp_path):
    store = OverlayStore(tmp_path)
    png, jpeg = store.save(Image.new("RGB", (8, 8), "red")), store.save(Image.new("RGBA", (8, 8)), format="JPEG")
    assert png.suffix == ".png" and jpeg.suffix == ".jpg"
    with Image.open(png) as a, Image.open(jpeg) as b:
        assert (a.format, b.format) == ("PNG", "JPEG")


def test_overlay_lookup_tables_match_the_per_pixel_formula():
    """viz.overlay's 256-entry tables give exactly the pixels of the per-pixel colour map and weight."""
    import numpy as np

    from captioner import viz

    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (50, 40, 3), dtype=np.uint8))
    alpha = rng.random((7, 7)).astype(np.float32)
    heat = Image.fromarray((alpha / alpha.max() * 255).astype(np.uint8), "L").resize(image.size,
                                                                                      Image.Resampling.BICUBIC)
    h = np.asarray(heat, dtype=np.float32) / 255.0  # (H, W)
    weight = 0.55 * h[..., None] ** 0.8
    expected = np.asarray(image, np.float32) * (1 - weight) + viz._colormap(h).astype(np.float32) * weight
    assert np.array_equal(np.asarray(viz.overlay(image, alpha)), np.clip(expected, 0, 255).astype(np.uint8))


@pytest.mark.parametrize("value, message", [("0", "counted from 1"), ("-2", "counted from 1"), ("two", "whole number")])
def test_the_screenshot_word_is_counted_from_one_as_the_slider_counts(value, message, capsys):
    from scripts.screenshot import get_args_parser

    with pytest.raises(SystemExit):
        get_args_parser().parse_args(["--word", value])
    assert message in capsys.readouterr().err
    assert get_args_parser().parse_args(["--word", "1"]).word == 1


def test_nbest_table_shows_the_score_it_is_ranked_by():
    """With a length penalty the rank follows log_prob / words ** penalty, which the table shows beside log_prob."""
    nbest = [{"text": "a b c d", "log_prob": -2.296, "score": -0.6}, {"text": "a b", "log_prob": -1.968, "score": -0.9}]
    rows = app_views.nbest_rows(nbest)
    assert [r[0] for r in rows] == [1, 2] and [r[2] for r in rows] == [-0.6, -0.9] and [r[3] for r in rows] == [
        -2.296, -1.968]
    assert rows[0][2] >= rows[1][2]


def test_an_elongated_upload_is_captioned_with_a_warning(files, tmp_path):
    banner = tmp_path / "banner.png"
    Image.new("RGB", (4000, 60), "white").save(banner)
    answer = app.explain_json(str(banner), 1, str(files["checkpoint"]))
    assert answer["text"] and "squeezed into the encoder's square input" in answer["warning"]


def test_a_full_model_queue_answers_busy_at_once(files, monkeypatch):
    """Past the batcher's bound a request gets one sentence ("busy, try again") at once, not an unbounded wait."""
    import time

    from captioner.serving import Batcher

    monkeypatch.setattr(app_impl, "BATCHER", Batcher(app_impl._run_batch, max_waiting=0))
    start = time.perf_counter()
    with pytest.raises(app.gr.Error) as info:
        app.predict(str(files["images"][0]), 3, str(files["checkpoint"]))
    assert "busy" in str(info.value.message) and "try again" in str(info.value.message)
    assert "\n" not in str(info.value.message) and time.perf_counter() - start < 5
