"""The light install: a fresh venv with `pip install ".[onnx,app]"` has no torch and stays under 500 MB, and the app
started from it with `--runtime onnx` on an exported shapes-soft passes the browser test's checks (overlays per
word, the word slider, the chart, n-best and downloads, the Compare view), leaves out the Point and tell tab, and
refuses regions on the API in one sentence. The venv lives in pytest's tmp folder; pip's cache makes reruns fast."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_browser import (browser, check_chart_and_nbest, check_compare, check_downloads,  # noqa: F401 - fixtures
                          check_overlays_and_word_view, open_page, page)
from test_app import free_port
from test_package import copy_source

pytest.importorskip("onnx")

ROOT = Path(__file__).resolve().parents[1]
MAX_MB = 500  # the light install's budget: onnxruntime, numpy, Pillow, gradio
pytestmark = pytest.mark.integration


def run(cmd: list, timeout: int = 900, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing from the repository leaks in
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout, **kwargs)


def megabytes(folder: Path) -> int:
    return int(run(["du", "-sm", f"{folder}/"]).stdout.split()[0])


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory) -> Path:
    """`python -m venv` + `pip install ".[onnx,app]"` from a copy of the source; returns the venv."""
    root = tmp_path_factory.mktemp("light")
    venv = root / "venv"
    done = run([sys.executable, "-m", "venv", venv])
    assert done.returncode == 0, done.stderr[-2000:]
    done = run([venv / "bin" / "python", "-m", "pip", "install", "--quiet",
                f"{copy_source(root / 'src')}[onnx,app]"], cwd=root)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return venv


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> list[Path]:
    from captioner.scenes.shapes import make_image

    folder = tmp_path_factory.mktemp("scenes")
    for seed in (31337, 31338):  # seeds no dataset of the project uses
        make_image(seed, "test", 1)[0].save(folder / f"scene-{seed}.png")
    return sorted(folder.glob("*.png"))


@pytest.fixture(scope="module")
def server(light_venv, scenes, tmp_path_factory):
    """captioner-app --runtime onnx from the light venv (run outside the repository) on exported shapes-soft and
    shapes-hard, exported with this environment's torch; yields its URL."""
    import httpx

    from captioner.commands.export import cli as export

    root = tmp_path_factory.mktemp("served")
    for name in ("shapes-soft", "shapes-hard"):
        assert export(["onnx", str(ROOT / "checkpoints" / name), str(root / "exported" / name)]) == 0
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (root / "server.log").open("w")
    start = time.monotonic()
    process = subprocess.Popen([light_venv / "bin" / "captioner-app", "--runtime", "onnx", "--port", str(port),
                                "--checkpoint", root / "exported" / "shapes-soft",
                                "--checkpoint", root / "exported" / "shapes-hard", "--examples", scenes[0].parent],
                               cwd=root, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "GRADIO_TEMP_DIR": str(root / "gradio"), "PYTHONPATH": ""})
    try:
        while time.monotonic() - start < 120 and process.poll() is None:
            try:
                if httpx.get(f"{url}/gradio_api/info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert process.poll() is None, (root / "server.log").read_text()[-3000:]
        print(f"\nthe ONNX Runtime app answered {time.monotonic() - start:.1f} s after its start")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()


def test_the_light_install_has_no_torch(light_venv):
    python = light_venv / "bin" / "python"
    done = run([python, "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"])
    assert done.stdout.strip() == "True", done.stderr
    assert "torch" not in run([python, "-m", "pip", "list"]).stdout.lower()


# The largest parts: gradio and its pandas, onnxruntime, numpy, pip and setuptools (docs/onnx.md). matplotlib is not
# in it: its 81 MB took the venv to 532 MB for the overlays' colour table alone, which captioner.viz now defines.
def test_the_light_install_fits_its_budget(light_venv):
    size = megabytes(light_venv)
    print(f'\nfresh venv with pip install ".[onnx,app]": {size} MB (this environment: '
          f"{megabytes(Path(sys.prefix).resolve())} MB)")
    assert size <= MAX_MB


def test_the_onnx_app_in_the_browser(page, scenes):
    caption = check_overlays_and_word_view(page, scenes[0])
    check_chart_and_nbest(page, caption)
    check_downloads(page, caption)
    left, right = check_compare(page)
    assert all(word in left for word in caption.split())  # the left is the Explore tab's checkpoint
    assert page.get_by_role("tab", name="Point and tell").count() == 0
    assert "ONNX Runtime" in page.locator("#server-note").inner_text()


def test_the_api_answers_and_refuses_regions(server, scenes):
    import base64

    import httpx

    picture = {"url": "data:image/png;base64," + base64.b64encode(scenes[1].read_bytes()).decode(),
               "meta": {"_type": "gradio.FileData"}}
    answer = httpx.post(f"{server}/gradio_api/run/explain", json={"data": [picture, 3, "shapes-soft"]}, timeout=120)
    explained = answer.json()["data"][0]
    assert explained["checkpoint"] == "shapes-soft" and len(explained["word_probs"]) == len(explained["tokens"]) > 2
    assert explained["in_domain"] is True and explained["nbest"][0]["text"] == explained["text"]
    refused = httpx.post(f"{server}/gradio_api/run/explain_regions",
                         json={"data": [picture, 3, "shapes-soft", "[[0, 0, 50, 50]]"]}, timeout=120).json()
    assert refused["error"].startswith("regions steer a caption on the PyTorch route only")
