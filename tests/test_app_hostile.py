"""The app against hostile and careless input: size limits on every route, bounded temporary files, checkpoints
checked fully at start-up, no server path in anything a user sees, bad flags in one line."""

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import app
from captioner.commands.runner import run
from captioner.commands import app as app_impl
from captioner.serving import MAX_UPLOAD_BYTES, OverlayStore, short_names
from test_app import HTTPX, make_bad_files, make_checkpoint, make_images, running_app

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "checkpoints"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    return {"root": root, "checkpoint": make_checkpoint(root / "ckpt"), "images": make_images(root / "images"),
            "bad": make_bad_files(root / "bad"), "cache": root / "overlays"}


@pytest.fixture(scope="module")
def server(files):
    with running_app(files["checkpoint"], files["cache"], examples=files["images"]) as url:
        yield url


def big_png(min_bytes: int) -> bytes:
    """A PNG of random pixels (incompressible) of at least ``min_bytes``, well under the pixel limit."""
    side = int((min_bytes / 3) ** 0.5) + 64
    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=0)
    data = buffer.getvalue()
    assert len(data) > min_bytes
    return data


def call(url: str, api: str, data: list, timeout: float = 60) -> tuple[int, str]:
    """POST /gradio_api/call/<api> with raw JSON, then read the event stream: (status, text of the answer)."""
    import httpx

    with httpx.Client(timeout=timeout) as http:
        posted = http.post(f"{url}/gradio_api/call/{api}", json={"data": data})
        if posted.status_code != 200:
            return posted.status_code, posted.text
        event = posted.json()["event_id"]
        answer = http.get(f"{url}/gradio_api/call/{api}/{event}")
        return answer.status_code, answer.text


# ---- upload size, whatever the route ------------------------------------------------------------------------------

def test_data_url_over_the_limit_is_refused_and_never_captioned(server, files, monkeypatch):
    calls = []
    real = app_impl.load_picture
    monkeypatch.setattr(app_impl, "load_picture", lambda *a, **k: calls.append(1) or real(*a, **k))
    png = big_png(MAX_UPLOAD_BYTES + 5 * 2**20)  # 25 MB: the old app decoded and captioned it
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    status, text = call(server, "caption", [{"url": url, "meta": {"_type": "gradio.FileData"}}, 3, "ckpt"])
    assert status == 413 or "event: error" in text, (status, text[:300])
    assert not calls
    # A small data: URL still works through the same route (the limit is not a ban on data: URLs).
    small = base64.b64encode(files["images"][0].read_bytes()).decode()
    status, text = call(server, "caption", [{"url": "data:image/png;base64," + small,
                                              "meta": {"_type": "gradio.FileData"}}, 3, "ckpt"])
    assert status == 200 and "event: complete" in text, text[:300]


def test_data_urls_are_decoded_by_open_image_with_its_limits(server):
    long_strip = io.BytesIO()
    Image.new("RGB", (20000, 2), "white").save(long_strip, format="PNG")  # tiny file, a side over the limit
    for payload, message in [(long_strip.getvalue(), "side over the limit"), (b"not an image at all", "not an image")]:
        url = "data:image/png;base64," + base64.b64encode(payload).decode()
        status, text = call(server, "caption", [{"url": url, "meta": {"_type": "gradio.FileData"}}, 3, "ckpt"])
        assert status == 200 and "event: error" in text and message in text, text[:400]
        assert "/tmp/" not in text and "upload-" not in text


def test_image_component_refuses_big_data_url_before_decoding():
    from gradio.data_classes import ImageData

    component = app_impl._image_input()
    payload = ImageData(url="data:image/png;base64," + "A" * (MAX_UPLOAD_BYTES * 4 // 3 + 400))
    with pytest.raises(app.gr.Error, match="upload limit"):
        component.preprocess(payload)


def test_predict_refuses_a_file_over_the_limit(files, tmp_path):
    big = tmp_path / "big.png"
    with open(big, "wb") as f:
        f.write(files["images"][0].read_bytes())
        f.truncate(MAX_UPLOAD_BYTES + 1)  # sparse: cheap to make, over the limit on disk
    with pytest.raises(app.gr.Error, match="limit") as info:
        app.predict(str(big), 1, str(files["checkpoint"]))
    assert str(tmp_path) not in info.value.message and "big.png" in info.value.message


# ---- temporary files stay bounded ----------------------------------------------------------------------------------

def test_overlay_store_prunes_by_age_size_and_count(tmp_path):
    store = OverlayStore(tmp_path / "o", max_age_s=100, max_bytes=10**9, max_files=5, keep_s=0)
    paths = [store.save(Image.new("RGB", (16, 16), (i, 0, 0))) for i in range(9)]
    size = paths[-1].stat().st_size
    now = time.time()
    for i, p in enumerate(paths):
        os.utime(p, (now - 50 + i, now - 50 + i))  # oldest first
    os.utime(paths[0], (now - 500, now - 500))  # past the age limit
    store.prune(now)
    left = sorted(p.name for p in store.folder.iterdir())
    assert left == sorted(p.name for p in paths[4:])  # the age victim, then the oldest until 5 remain
    size_store = OverlayStore(tmp_path / "s", max_bytes=3 * size, keep_s=0)
    for i in range(6):
        size_store.save(Image.new("RGB", (16, 16), (0, i, 0)))
    size_store.prune()
    assert size_store.usage()[1] <= 3 * size


def test_prune_lists_the_folder_only_past_a_limit_or_the_interval(tmp_path):
    store = OverlayStore(tmp_path / "o", max_files=3, keep_s=0, scan_interval_s=60)
    now = time.time()
    store.prune(now)  # the first call lists the folder (empty)
    for i in range(2):
        store.save(Image.new("RGB", (8, 8), (i, 1, 2)))
    for i in range(5):  # files the store did not write: only a listing sees them
        (store.folder / f"other{i}.bin").write_bytes(b"x")
    assert store.prune(now + 1) == 0 and store.usage()[0] == 7  # within the running totals: no listing
    assert store.prune(now + 61) == 4 and store.usage()[0] == 3  # the interval passed: listed and pruned
    for i in range(2):
        store.save(Image.new("RGB", (8, 8), (i, 9, 9)))
    assert store.prune(now + 62) == 2 and store.usage()[0] == 3  # past max_files by its own count: listed at once


def test_upload_quota_measures_at_most_every_rescan(tmp_path):
    from captioner.serving import UploadQuota

    quota = UploadQuota(None, tmp_path, max_bytes=100, rescan_s=10)
    assert quota.held_bytes(now=0) == 0
    (tmp_path / "big.bin").write_bytes(b"x" * 200)
    assert quota.held_bytes(now=5) == 0  # the last measure still holds
    assert quota.held_bytes(now=10) == 200


def test_many_captions_keep_the_overlay_folder_bounded(files, tmp_path):
    from gradio_client import Client, handle_file

    store = OverlayStore(tmp_path / "bounded", max_files=10, keep_s=0)
    images = []
    for i in range(6):  # distinct images, so distinct overlays
        path = tmp_path / f"img{i}.png"
        Image.new("RGB", (64, 48), (40 * i, 255 - 40 * i, 128)).save(path)
        images.append(path)
    with running_app(files["checkpoint"], tmp_path / "unused", store=store) as url:
        client = Client(url, download_files=str(tmp_path / "dl"), verbose=False, httpx_kwargs=dict(HTTPX))
        for path in images:
            client.predict(handle_file(str(path)), 1, api_name="/caption")
            assert store.usage()[0] <= 10
    assert store.usage()[0] <= 10  # 6 captions x 6 words = 36 overlays written


def test_overlays_are_served_without_a_second_copy(files, tmp_path):
    """The store lives inside Gradio's cache folder: Gradio serves the overlay file itself, it copies nothing."""
    from gradio_client import Client, handle_file

    cache = app_impl.GRADIO_CACHE
    store = OverlayStore(cache / f"test-overlays-{os.getpid()}", keep_s=0)
    with running_app(files["checkpoint"], tmp_path / "unused", store=store) as url:
        client = Client(url, download_files=str(tmp_path / "dl"), verbose=False, httpx_kwargs=dict(HTTPX))
        Image.new("RGB", (80, 60), (12, 200, 34)).save(tmp_path / "one.png")
        _, gallery = client.predict(handle_file(str(tmp_path / "one.png")), 1, api_name="/caption")
        digests = {hashlib.sha256(Path(item["image"]).read_bytes()).hexdigest() for item in gallery}
        copies = [p for p in cache.rglob("*.*")  # while the server runs: closing it empties its cache
                  if p.stat().st_size < 10**6 and hashlib.sha256(p.read_bytes()).hexdigest() in digests]
    assert len(copies) == len(digests), [str(p) for p in copies]


def test_uploads_stop_when_the_cache_folder_is_full(files, tmp_path, monkeypatch):
    import httpx

    def upload(url):
        with open(files["images"][0], "rb") as f:
            return httpx.post(f"{url}/gradio_api/upload", files={"files": ("x.bin", f)}, timeout=60).status_code

    with running_app(files["checkpoint"], tmp_path / "a") as url:
        assert upload(url) == 200
    monkeypatch.setattr(app_impl, "MAX_CACHE_BYTES", 0)  # "full" whatever it holds
    with running_app(files["checkpoint"], tmp_path / "b") as url:
        assert upload(url) == 507


# ---- checkpoints are loaded fully at start-up --------------------------------------------------------------------------

def broken(files, kind: str, tmp_path: Path) -> Path:
    import shutil

    folder = tmp_path / kind
    shutil.copytree(files["checkpoint"], folder)
    if kind == "vocab":
        (folder / "vocab.json").write_text('["a", 5, {"x": 1}]')
    elif kind == "weights":
        (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    elif kind == "version":
        config = json.loads((folder / "config.json").read_text())
        config["version"] = "2"
        (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("kind", ["vocab", "weights", "version"])
def test_start_up_refuses_a_broken_checkpoint_in_one_line(files, tmp_path, kind, capsys, monkeypatch):
    launched = []
    monkeypatch.setattr(app_impl, "launch", lambda *a, **k: launched.append(1))
    argv = ["--checkpoint", str(files["checkpoint"]), "--checkpoint", str(broken(files, kind, tmp_path))]
    assert run(app.main, app.get_args_parser(), "captioner-app", argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("captioner-app: error: checkpoint ") and "\n" not in err and "Traceback" not in err
    assert not launched


def nan_checkpoint(files, tmp_path: Path) -> Path:
    from safetensors.torch import load_file, save_file

    folder = broken(files, "nan", tmp_path)
    state = load_file(folder / "model.safetensors")
    state = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in state.items()}
    save_file(state, folder / "model.safetensors")
    return folder


def test_start_up_refuses_nan_weights(files, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(app_impl, "launch", lambda *a, **k: pytest.fail("launched a NaN model"))
    argv = ["--checkpoint", str(nan_checkpoint(files, tmp_path))]
    assert run(app.main, app.get_args_parser(), "captioner-app", argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("captioner-app: error: checkpoint nan ") and "\n" not in err


def test_nan_weights_are_an_error_not_an_index_error(files, tmp_path):
    folder = nan_checkpoint(files, tmp_path)
    for beam in (1, 3):
        with pytest.raises(app.gr.Error) as info:
            app.predict(str(files["images"][0]), beam, str(folder))
        assert "\n" not in info.value.message and "index" not in info.value.message.lower()


# ---- names, not paths ------------------------------------------------------------------------------------------------

def server_paths(files) -> list[str]:
    """What must never reach a user: the temporary folders, the repository, the cache folder, the home folder."""
    import tempfile

    return ["/tmp/", tempfile.gettempdir() + "/", str(files["root"]), str(ROOT), str(app_impl.GRADIO_CACHE),
            str(app_impl.STORE.folder), str(Path.home()) + "/"]


def upload(url: str, path: Path) -> str:
    """POST /gradio_api/upload: the name the server gives the file (what a client sends back as input)."""
    import httpx

    with open(path, "rb") as f:
        answer = httpx.post(f"{url}/gradio_api/upload", files={"files": (path.name, f)}, timeout=60)
    answer.raise_for_status()
    return answer.json()[0]


def test_no_server_path_in_the_page_config_info_answers_or_errors(server, files):
    """Raw HTTP, as a browser sees it: the page, /config (with its example images), the API description, the
    upload reply, /caption and /explain answers (file paths and URLs included) and error answers."""
    import httpx
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError

    seen = {"page": httpx.get(f"{server}/").text, "config": httpx.get(f"{server}/config").text,
            "info": httpx.get(f"{server}/gradio_api/info").text}
    name = upload(server, files["images"][0])
    seen["upload"] = name
    image = {"path": name, "meta": {"_type": "gradio.FileData"}}
    for api in ("caption", "explain"):
        status, seen[api] = call(server, api, [image, 3, "ckpt"])
        assert status == 200 and "event: complete" in seen[api], seen[api][:300]
    for bad in files["bad"]:
        status, seen[f"error {bad.name}"] = call(server, "caption", [{"path": upload(server, bad),
                                                                     "meta": {"_type": "gradio.FileData"}}, 3, "ckpt"])
        assert "event: error" in seen[f"error {bad.name}"]
    seen["error checkpoint"] = call(server, "caption", [image, 3, "nope"])[1]
    for given in (str(files["images"][1]), "relative.png"):  # not uploaded: Gradio's message names the path
        seen[f"error {given}"] = call(server, "caption", [{"path": given, "meta": {"_type": "gradio.FileData"}}, 3,
                                                         "ckpt"])[1]
    client = Client(server, verbose=False, httpx_kwargs=dict(HTTPX))
    with pytest.raises(AppError) as info:
        client.predict(handle_file(str(files["bad"][0])), api_name="/caption")
    seen["client error"] = str(info.value)
    for what, text in seen.items():
        for path in server_paths(files):
            assert path not in text, (what, path, text[:500])
    assert "files/" in seen["config"] and "files/" in seen["caption"]  # the examples and overlays, by opaque name
    assert '"ckpt"' in seen["info"]  # the short name is what the API offers


def test_files_are_served_by_opaque_name_only(server, files):
    import re

    import httpx

    config = httpx.get(f"{server}/config").text
    names = re.findall(r"files/([A-Za-z0-9_-]{16})/([^\"/]+)", config)
    assert {name for _, name in names} >= {"circle.png", "square.jpg"}  # the example images
    fid, name = next((i, n) for i, n in names if n == "circle.png")
    got = httpx.get(f"{server}/files/{fid}/{name}")
    assert got.status_code == 200 and got.content == files["images"][0].read_bytes()
    assert httpx.get(f"{server}/gradio_api/file=files/{fid}/{name}").content == got.content  # gradio_client's way
    for bad in (f"/files/{fid}/square.jpg", f"/files/{'A' * 16}/{name}", f"/files/{fid}/..%2F..%2Fconfig.json",
                f"/files/{fid}/%2e%2e", f"/gradio_api/file=files/{'B' * 16}/{name}",
                f"/gradio_api/file={files['images'][0]}", "/gradio_api/file=/etc/hostname",
                "/gradio_api/file=http://127.0.0.1/"):  # Gradio's own route by path or URL: not any more
        answer = httpx.get(f"{server}{bad}")
        assert answer.status_code == 404, (bad, answer.status_code)


def test_opaque_files_serves_file_bytes_unchanged_and_hides_answers(tmp_path):
    """The middleware on a two-route app: a JSON answer naming a file, and Gradio's file route."""
    import asyncio

    import httpx
    from starlette.applications import Starlette
    from starlette.responses import FileResponse, JSONResponse
    from starlette.routing import Route

    from captioner.serving import FileRegistry, OpaqueFiles

    download = tmp_path / "caption-1.json"
    download.write_text('{\n "note": "/tmp/ is only text here"\n}')

    async def answer(request):
        return JSONResponse({"path": str(download), "error": f"cannot read {tmp_path / 'other.png'}"})

    async def file(request):
        return FileResponse(request.path_params["path"], media_type="application/json")

    inner = Starlette(routes=[Route("/answer", answer), Route("/gradio_api/file={path:path}", file)])
    served = OpaqueFiles(inner, FileRegistry([tmp_path]))

    async def fetch():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served), base_url="http://app") as http:
            got = (await http.get("/answer")).json()
            return got, await http.get(f"/{got['path']}"), await http.get("/files/" + "D" * 16 + "/caption-1.json")

    got, body, unknown = asyncio.run(fetch())
    assert got["path"].startswith("files/") and str(tmp_path) not in json.dumps(got) and "other.png" in got["error"]
    assert body.status_code == 200 and body.content == download.read_bytes()  # a download is never rewritten
    assert unknown.status_code == 404


def test_file_registry(tmp_path):
    from captioner.serving import FileRegistry

    (tmp_path / "served").mkdir()
    inside, outside = tmp_path / "served" / "a b.png", tmp_path / "secret.txt"
    inside.write_bytes(b"x")
    outside.write_text("no")
    registry = FileRegistry([tmp_path / "served"], private=[tmp_path], max_entries=2)
    token = registry.token(str(inside))
    assert token.startswith("files/") and token.endswith("/a b.png") and registry.token(str(inside)) == token
    assert registry.token(str(outside)) is None and registry.token(str(tmp_path / "served")) is None
    fid = token.split("/")[1]
    assert registry.lookup(fid, "a b.png") == str(inside) and registry.lookup(fid, "other.png") is None
    hidden = registry.hide({"path": str(inside), "url": f"http://h/gradio_api/file={inside}".replace(" ", "%20"),
                            "error": f"cannot read {outside} or {inside}", "n": 3})
    assert hidden["path"] == token and hidden["url"] == f"http://h/{token}".replace(" ", "%20")
    assert str(tmp_path) not in json.dumps(hidden) and "secret.txt" in hidden["error"] and hidden["n"] == 3
    assert registry.reveal({"data": [{"path": token}, "files/" + "C" * 16 + "/x"]}) == {
        "data": [{"path": str(inside)}, "files/" + "C" * 16 + "/x"]}
    chart = "data:image/png;base64,AAAA/tmp/" + str(tmp_path)  # an inline image is never edited
    assert registry.hide([chart, "/" + "x" * 10_000]) == [chart, "/" + "x" * 10_000]
    for i in range(2):  # bounded: the oldest id is forgotten
        (tmp_path / "served" / f"{i}.png").write_bytes(b"y")
        registry.token(str(tmp_path / "served" / f"{i}.png"))
    assert registry.lookup(fid, "a b.png") is None
    inside.unlink()


def test_default_checkpoints_dir(tmp_path):
    from captioner.serving import default_checkpoints_dir

    assert default_checkpoints_dir(tmp_path) == SHIPPED  # no ./checkpoints here: the one beside the package
    (tmp_path / "checkpoints").mkdir()
    assert default_checkpoints_dir(tmp_path) == tmp_path / "checkpoints"


def test_short_names():
    a, b, c = Path("/x/runs/a"), Path("/y/other/a"), Path("/z/b")
    assert list(short_names([a, c])) == ["a", "b"]
    assert list(short_names([a, b, c], ["runs/a", "/y/other/a", "b"])) == ["runs/a", "other/a", "b"]


@pytest.mark.skipif(not (SHIPPED / "shapes-soft").is_dir(), reason="shipped checkpoints not present")
def test_default_is_the_soft_model_by_short_name(files, monkeypatch):
    monkeypatch.setattr(app_impl, "SERVED", {})
    monkeypatch.setattr(app_impl, "CHECKPOINTS_DIR", SHIPPED)
    name, folder = app_impl.resolve(None)
    assert name == "shapes-soft" and json.loads((folder / "config.json").read_text())["model"]["attention"] == "soft"
    text, overlays = app.predict(str(files["images"][0]), 3, "shapes-soft")
    assert text and len(overlays) == len(text.split())
    assert app.explain_json(str(files["images"][0]), 3)["checkpoint"] == "shapes-soft"


# ---- flags -------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [["--port", "99999"], ["--port", "0"], ["--port", "-1"], ["--port", "x"],
                                   ["--checkpoints-dir", "/nonexistent-dir"], ["--examples", "/nonexistent"]])
def test_bad_flags_are_one_line_and_exit_2(flags, capsys):
    with pytest.raises(SystemExit) as info:
        app.get_args_parser().parse_args(flags)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("captioner-app: error:") and "\n" not in err


@pytest.mark.integration
def test_script_bad_port_in_a_subprocess():
    done = subprocess.run([sys.executable, str(ROOT / "app.py"), "--port", "99999"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "port" in done.stderr


def test_sessions_are_bounded(files, monkeypatch):
    """Every API call is a Gradio session with a copy of the page's config: launch keeps at most SESSIONS of them
    (Gradio's default of 10,000 grew a server under load by about half a gigabyte)."""
    demo = app.build_demo([files["checkpoint"]], examples=[])
    seen = {}
    monkeypatch.setattr(type(demo), "launch", lambda self, **kwargs: seen.update(kwargs))
    app_impl.launch(demo)
    assert seen["state_session_capacity"] == app_impl.SESSIONS <= 5000


def test_the_same_inline_image_saved_by_many_threads_at_once(tmp_path):
    """Clients sending the same data: URL at once each write under a temporary name of their own."""
    import threading

    from captioner.app.uploads import save_data_url

    url = "data:image/png;base64," + base64.b64encode(b"\x89PNG same bytes" * 1000).decode()
    paths, errors = [], []

    def save():
        try:
            paths.append(save_data_url(url, tmp_path))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    for _ in range(5):  # several rounds: the race needs the file to be missing when they start
        for p in tmp_path.iterdir():
            p.unlink()
        threads = [threading.Thread(target=save) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors and len(set(paths)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [Path(paths[0]).name]  # no temporary file left
