"""The app on the ONNX Runtime route: its handlers (/caption, /explain, the Explore tab, Compare, the downloads)
serve an exported folder in a process where torch cannot be imported, and answer as the PyTorch app does on the
same checkpoint; regions are refused in one sentence and the Point and tell tab is left out."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from test_onnx import BLOCK_TORCH, REPO, exported, model, pictures  # noqa: E402,F401 - fixtures

# Every handler the page and the API call, on the exported folder given as argv[1], image argv[2]; prints JSON.
HANDLERS = """
import json
from pathlib import Path
from captioner.commands import app as app_impl
from captioner.app.args import get_args_parser

folder, image = Path(sys.argv[1]), sys.argv[2]
assert app_impl.runtime() == "onnx"  # the default where torch is not installed
app_impl.served_checkpoints(get_args_parser().parse_args(["--checkpoint", str(folder)]))  # loads, smoke-tests
out = run_handlers(app_impl, {"tiny": folder, "twin": folder}, image)
assert_no_torch()
print(json.dumps(out))
"""

# The same calls on both routes (the source is sent to the subprocess too); the answers as JSON values.
RUN_HANDLERS = '''
def run_handlers(app_impl, served, image):
    demo = app_impl.build_demo(served, examples=[])
    handlers = {getattr(f.fn, "__name__", ""): f.fn for f in demo.fns.values()}
    text, overlays = app_impl.predict(image, 3, "tiny")
    ui = handlers["run_ui"](image, 3, "tiny")
    notice, left, right, rows = handlers["compare"](image, 3, "tiny", "twin")
    try:
        app_impl.explain_json(image, 3, "tiny", regions="[[0, 0, 32, 32]]")
        refused = None
    except Exception as error:
        refused = getattr(error, "message", str(error))  # gr.Error: the sentence the page shows
    return {"caption": text, "overlays": [label for _, label in overlays],
            "explain": app_impl.explain_json(image, 3, "tiny", with_alphas=True),
            "explore": {"notice": ui[0], "text": ui[1], "words": ui[2], "note": ui[3], "highlight": ui[6],
                        "nbest": ui[8]},
            "compare": {"notice": notice, "left": left, "right": right, "rows": rows},
            "downloads": sorted(Path(p).suffix for p in app_impl.downloads(ui[-1], 2)),
            "tabs": [b.label for b in demo.blocks.values() if type(b).__name__ == "Tab"],
            "regions_refused": refused}
'''
exec(RUN_HANDLERS)


@pytest.fixture(scope="module")
def answers(model, exported, tmp_path_factory):
    """(PyTorch app's answers on the checkpoint saved from ``model``, the ONNX app's on its export)."""
    from captioner.checkpoints.folder import save_checkpoint
    from captioner.commands import app as app_impl
    from captioner.serving import OverlayStore

    root = tmp_path_factory.mktemp("onnx-app")
    image = root / "noise.png"
    pictures(1, seed=3)[0].save(image)
    torch_folder = save_checkpoint(model, root / "tiny")
    old = app_impl.STORE, dict(app_impl.SERVED)
    app_impl.STORE = OverlayStore(root / "overlays")
    try:
        theirs = json.loads(json.dumps(run_handlers(app_impl, {"tiny": torch_folder, "twin": torch_folder},
                                                    str(image))))
    finally:
        app_impl.STORE = old[0]
        app_impl.SERVED.clear()
        app_impl.SERVED.update(old[1])
    script = BLOCK_TORCH + "\nfrom pathlib import Path\n" + RUN_HANDLERS + HANDLERS
    env = {**__import__("os").environ, "CAPTIONER_APP_CACHE": str(root / "onnx-cache")}
    done = subprocess.run([sys.executable, "-c", script, str(exported), str(image)], capture_output=True,
                          text=True, cwd=REPO, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return theirs, json.loads(done.stdout.strip().splitlines()[-1])


def test_the_onnx_app_answers_as_the_pytorch_app(answers):
    theirs, ours = answers
    assert len(theirs["explain"]["tokens"]) > 2  # the caption says something
    assert ours["caption"] == theirs["caption"] and ours["overlays"] == theirs["overlays"]
    a, b = ours["explain"], theirs["explain"]
    assert a["text"] == b["text"] and a["tokens"] == b["tokens"] and a["truncated"] == b["truncated"]
    assert np.allclose(a["word_probs"], b["word_probs"], atol=1e-4)
    assert np.allclose(a["betas"], b["betas"], atol=1e-4) and np.allclose(a["entropies"], b["entropies"], atol=1e-4)
    assert np.abs(np.array(a["alphas"]) - np.array(b["alphas"])).max() < 1e-4
    assert [h["text"] for h in a["nbest"]] == [h["text"] for h in b["nbest"]]  # the same ranking
    assert np.allclose([h["score"] for h in a["nbest"]], [h["score"] for h in b["nbest"]], atol=1e-3)
    assert a["in_domain"] == b["in_domain"] and a["domain_score"] == pytest.approx(b["domain_score"], rel=1e-4)
    for key in ("notice", "text", "words", "note", "highlight"):
        assert ours["explore"][key] == theirs["explore"][key], key
    assert [row[1] for row in ours["explore"]["nbest"]] == [row[1] for row in theirs["explore"]["nbest"]]
    for key in ("notice", "left", "right"):
        assert ours["compare"][key] == theirs["compare"][key], key
    assert [[r[1], r[3]] for r in ours["compare"]["rows"]] == [[r[1], r[3]] for r in theirs["compare"]["rows"]]
    assert np.allclose([[r[2], r[4]] for r in ours["compare"]["rows"]],
                       [[r[2], r[4]] for r in theirs["compare"]["rows"]], atol=2e-3)  # rounded to 3 places
    assert ours["downloads"] == theirs["downloads"] == [".json", ".png", ".png"]


def test_regions_are_refused_in_one_sentence_and_their_tab_left_out(answers):
    theirs, ours = answers
    assert theirs["regions_refused"] is None and "Point and tell" in theirs["tabs"]
    assert ours["regions_refused"].startswith("regions steer a caption on the PyTorch route only")
    assert "\n" not in ours["regions_refused"] and "Traceback" not in ours["regions_refused"]
    assert "Point and tell" not in ours["tabs"] and ours["tabs"][0] == "Explore" and "Compare" in ours["tabs"]


def test_exported_folders_are_found_and_loaded_by_their_runtime(exported, tmp_path):
    import shutil

    from captioner.errors import CheckpointError
    from captioner.serving import ModelCache, default_checkpoints_dir, find_checkpoints

    shutil.copytree(exported, tmp_path / "exported" / "tiny")
    (tmp_path / "checkpoints").mkdir()
    assert default_checkpoints_dir(tmp_path, runtime="onnx") == tmp_path / "exported"  # where docs/onnx.md exports
    assert default_checkpoints_dir(tmp_path) == tmp_path / "checkpoints"
    assert find_checkpoints(tmp_path / "exported", "onnx") == [tmp_path / "exported" / "tiny"]
    assert find_checkpoints(tmp_path / "exported") == []  # no config.json: not a PyTorch checkpoint
    assert ModelCache().get(exported).runtime == "onnx"  # no runtime given: by what the folder holds
    with pytest.raises(CheckpointError, match="serve it with --runtime onnx"):
        ModelCache(runtime="torch").get(exported)
