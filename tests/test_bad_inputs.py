"""One table of hostile and careless inputs, walked through every entry point as a user runs it (a subprocess):
a non-zero exit, one line on stderr, no traceback, every input file byte-identical afterwards, peak memory and
time bounded. The areas' own files (test_batch_hostile, test_checkpoint_trust, test_app_hostile,
test_train_cli) test each failure in depth; this file checks that the promise holds the same way everywhere."""

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "checkpoints" / "shapes-soft"
MAX_RSS_MB = 1500
TIMEOUT_S = 60

# One subprocess per case through every entry point (the areas' own files test each failure in the fast
# tier): the integration tier.
pytestmark = pytest.mark.integration

# Runs a script or module as __main__ and writes the process's peak RSS (VmHWM, kB) when it exits. VmHWM, not
# ru_maxrss: Linux carries ru_maxrss across exec, so a child of a big pytest process would report its parent's.
WRAPPER = ("import atexit, os, runpy, sys\n"
           "def peak():\n"
           "    with open('/proc/self/status') as f:\n"
           "        kb = next(line.split()[1] for line in f if line.startswith('VmHWM:'))\n"
           "    with open(os.environ['PEAK_FILE'], 'w') as out:\n"
           "        out.write(kb)\n"
           "atexit.register(peak)\n"
           "target, sys.argv = sys.argv[1], sys.argv[1:]\n"
           "if target.endswith('.py'):\n"
           "    runpy.run_path(target, run_name='__main__')\n"
           "else:\n"
           "    sys.argv[0] = target\n"
           "    runpy.run_module(target, run_name='__main__', alter_sys=True)\n")


def _png_header_only(path: Path, width: int, height: int) -> None:
    """A valid PNG of width x height whose pixel data compresses to a few kB (one grey row repeated)."""
    row = b"\x00" + b"\x80" * width
    packer = zlib.compressobj(9)
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def _broken_checkpoint(root: Path, name: str, edit=None, vocab=None) -> Path:
    folder = root / name
    shutil.copytree(SHIPPED, folder)
    if edit is not None:
        config = json.loads((folder / "config.json").read_text())
        edit(config)
        (folder / "config.json").write_text(json.dumps(config))
    if vocab is not None:
        (folder / "vocab.json").write_text(json.dumps(vocab))
    return folder


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad_inputs")
    Image.new("RGB", (48, 32), "blue").save(root / "good.png")
    _png_header_only(root / "line.png", 40_000_000, 1)
    (root / "text.jpg").write_text("not an image")
    (root / "notes.txt").write_bytes(b"my notes\nsecond line, no newline at the end")
    (root / "table.csv").write_bytes(b"name,size\nann,3\nbo")
    os.mkfifo(root / "pipe.jpg")
    (root / "empty").mkdir()
    _broken_checkpoint(root, "ck_hidden", lambda c: c["model"].__setitem__("hidden_dim", 30000))
    _broken_checkpoint(root, "ck_type", lambda c: c["model"].__setitem__("embed_dim", "128"))
    _broken_checkpoint(root, "ck_version", lambda c: c.__setitem__("version", "2"))
    _broken_checkpoint(root, "ck_size", lambda c: c["preprocessing"].__setitem__("size", 100000))
    _broken_checkpoint(root, "ck_torchvision", lambda c: c["model"].update(
        encoder="resnet50", encoder_weights="IMAGENET1K_V2", encoder_channels=1024))
    _broken_checkpoint(root, "ck_vocab", vocab=["<pad>", "<start>", "<end>", "<unk>", "a", "a", 7])
    (root / "karpathy.json").write_text(json.dumps({"dataset": "x", "images": [
        {"filename": 5, "split": "train", "sentences": [{"tokens": ["a", "b"], "raw": "a b"}]}]}))
    (root / "recipe.toml").write_text("[optim\nlr = ")
    return root


# (name, argv: script or module then its arguments, with {D} for the inputs folder, what stderr must mention)
CASES = [
    ("caption: 40,000,000 x 1 PNG", ["caption.py", "{D}/line.png", "--output", "{D}/out1.jsonl"], None),
    ("caption: text named .jpg", ["caption.py", "{D}/text.jpg", "--output", "{D}/out2.jsonl"], None),
    ("caption: a FIFO", ["caption.py", "{D}/pipe.jpg", "--output", "{D}/out3.jsonl"], None),
    ("caption: empty folder", ["caption.py", "{D}/empty"], "no image found"),
    ("caption: --output is someone's notes", ["caption.py", "{D}/good.png", "--output", "{D}/notes.txt"],
     "left unchanged"),
    ("caption: --output is a CSV of other columns", ["caption.py", "{D}/good.png", "--output", "{D}/table.csv"],
     "left unchanged"),
    ("caption: --output is a folder", ["caption.py", "{D}/good.png", "--output", "{D}/empty"], "folder"),
    ("caption: --beam-size 100000", ["caption.py", "{D}/good.png", "--beam-size", "100000"], "--beam-size"),
    ("caption: --attention-dir under a file", ["caption.py", "{D}/good.png", "--attention-dir", "{D}/notes.txt/x"],
     "--attention-dir"),
    ("caption: hidden_dim 30000", ["caption.py", "{D}/good.png", "--checkpoint", "{D}/ck_hidden"], "hidden_dim"),
    ("caption: embed_dim '128'", ["caption.py", "{D}/good.png", "--checkpoint", "{D}/ck_type"], "embed_dim"),
    ("caption: version '2'", ["caption.py", "{D}/good.png", "--checkpoint", "{D}/ck_version"], "version"),
    ("caption: preprocessing.size 100000", ["caption.py", "{D}/good.png", "--checkpoint", "{D}/ck_size"], "size"),
    ("caption: torchvision weights offline", ["caption.py", "{D}/good.png", "--checkpoint", "{D}/ck_torchvision"],
     None),
    ("caption: duplicate vocabulary", ["caption.py", "{D}/good.png", "--checkpoint", "{D}/ck_vocab"], "vocab"),
    ("app: --port 99999", ["app.py", "--port", "99999"], "port"),
    ("app: broken vocabulary at start-up", ["app.py", "--checkpoint", "{D}/ck_vocab"], "ck_vocab"),
    ("app: version '2' at start-up", ["app.py", "--checkpoint", "{D}/ck_version"], "version"),
    ("train: --metric BOGUS", ["train.py", "--metric", "BOGUS", "--out", "{D}/run"], "--metric"),
    ("train: --lr -1", ["train.py", "--lr", "-1", "--out", "{D}/run"], "--lr"),
    ("train: --batch-size 0", ["train.py", "--batch-size", "0", "--out", "{D}/run"], "--batch-size"),
    ("train: unreadable recipe", ["train.py", "--config", "{D}/recipe.toml", "--out", "{D}/run"], "recipe"),
    ("train: filename 5 in a Karpathy JSON", ["train.py", "--dataset", "{D}/karpathy.json", "--out", "{D}/run",
                                              "--test-splits", ""], None),
    ("evaluate: wrong type in config.json", ["captioner.evaluate", "--checkpoint", "{D}/ck_type"], "embed_dim"),
    ("prepare: captions file missing", ["captioner.data.prepare", "own", "--captions", "{D}/nothing.csv",
                                        "--images", "{D}/empty", "--name", "x", "--out", "{D}/prepared"], None),
    ("download: unknown dataset", ["captioner.data.download", "imagenet", "--to", "{D}/data"], None),
]


def _digest(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


@pytest.mark.parametrize("name, argv, mention", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_and_changes_nothing(inputs, tmp_path, name, argv, mention):
    argv = [a.replace("{D}", str(inputs)) for a in argv]
    before = _digest(inputs)
    peak_file = tmp_path / "peak"
    env = {**os.environ, "PEAK_FILE": str(peak_file), "CAPTIONER_DEBUG": "", "HF_HUB_OFFLINE": "1",
           "TORCH_HOME": str(tmp_path / "torch_home")}  # an empty hub cache: nothing to find, nothing to fetch
    result = subprocess.run([sys.executable, "-c", WRAPPER, *argv, "--quiet"] if argv[0] == "caption.py"
                            else [sys.executable, "-c", WRAPPER, *argv], cwd=ROOT, capture_output=True, text=True,
                            timeout=TIMEOUT_S, env=env)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, f"{name}: exit 0\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    if argv[0] == "caption.py" and result.returncode == 1:  # a batch records the bad file and goes on
        record = json.loads(Path(argv[argv.index("--output") + 1]).read_text().splitlines()[0])
        assert record.get("error"), record
        assert len(lines) <= 1, result.stderr
    else:
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert ": error: " in lines[0], lines[0]
    if mention:
        assert mention in lines[0], lines[0]
    after = _digest(inputs)
    changed = [p for p, h in before.items() if after.get(p) != h]
    assert not changed, f"{name} changed {changed}"
    peak_mb = int(peak_file.read_text()) / 1024
    assert peak_mb < MAX_RSS_MB, f"{name}: peak RSS {peak_mb:.0f} MB"
