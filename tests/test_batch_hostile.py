"""caption.py against hostile or careless inputs: cheap refusals of costly images, bounded flags, inputs that would
hang or vanish, tiny images, one line for every error."""

import json
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from PIL import Image

import caption
from captioner.errors import ImageError
from captioner.images import ELONGATED_RATIO, MAX_IMAGE_SIDE, caption_warning, open_image
from test_batch import checkpoint, scenes  # noqa: F401 - the tiny model and its scenes, shared fixtures

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*argv) -> int:
    return caption.cli([*map(str, argv), "--quiet", "--workers", "0"])


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def long_png(path: Path, width: int, height: int) -> Path:
    """A valid 8-bit grey PNG of any size, written without holding its pixels (64,000,000 x 1 is 62 kB)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = zlib.compressobj(9)
    body = b"".join(rows.compress(b"\x00" * (width + 1)) for _ in range(height)) + rows.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", body) + chunk(b"IEND", b""))
    return path


# --------------------------------------------------------------------------------------------- decoding cost

def test_a_64_million_by_1_png_is_refused_from_its_header(tmp_path, checkpoint):  # noqa: F811
    png = long_png(tmp_path / "long.png", 64_000_000, 1)
    assert png.stat().st_size < 100_000
    start = time.perf_counter()
    with pytest.raises(ImageError, match=f"side over the limit of {MAX_IMAGE_SIDE}"):
        open_image(png)
    assert time.perf_counter() - start < 0.5  # before: 18 s and 2 GB decoding and resizing it
    # the same through caption.py, in a child process so a regression cannot take this one's memory
    out = tmp_path / "out.jsonl"
    result = subprocess.run([sys.executable, "caption.py", str(png), "--checkpoint", str(checkpoint), "--output",
                             str(out), "--workers", "0", "--quiet"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1, result.stderr
    [record] = read_jsonl(out)
    assert "side over the limit" in record["error"] and "caption" not in record


def test_an_elongated_image_is_decoded_and_its_caption_carries_a_warning(tmp_path):
    """A banner costs no more than its pixels (the encoder squeezes any image into its square): decoded, and
    the caption warned about; a long side past MAX_IMAGE_SIDE is still refused."""
    png = long_png(tmp_path / "strip.png", 4000, 60)  # a 4000x60 banner, 67:1
    assert open_image(png).size == (4000, 60)
    assert "(67:1), squeezed" in caption_warning((4000, 60), ["a", "banner"])
    assert caption_warning((4000, 1000), ["a", "panorama"]) is None  # 4:1: no warning
    assert ELONGATED_RATIO < 67
    with pytest.raises(ImageError, match="side over the limit"):
        open_image(long_png(tmp_path / "thread.png", MAX_IMAGE_SIDE + 1, 1))


# --------------------------------------------------------------------------------------------- flags

@pytest.mark.parametrize("argv, flag", [
    (["--beam-size", "100000"], "--beam-size"),
    (["--beam-size", "21"], "--beam-size"),
    (["--batch-size", "1000000"], "--batch-size"),
    (["--beam-size", "20", "--batch-size", "512"], "--beam-size x --batch-size"),
    (["--max-len", "1000000"], "--max-len"),
    (["--limit", str(10**12)], "--limit"),
    (["--rank", "2", "--world-size", "2"], "--rank"),
    (["--rank", "0"], "--rank and --world-size"),
    (["--world-size", "100000", "--rank", "0"], "--world-size"),
], ids=["beam-huge", "beam-21", "batch-huge", "beam-x-batch", "max-len-huge", "limit-huge", "rank-outside",
        "rank-alone", "world-huge"])
def test_size_flags_have_upper_bounds(scenes, checkpoint, capsys, argv, flag):  # noqa: F811
    assert run_cli(scenes[0], "--checkpoint", checkpoint, *argv) == 2
    assert flag in one_line(capsys)


def test_too_many_workers_is_refused_before_any_work(scenes, checkpoint, capsys):  # noqa: F811
    # (parsed by hand: run_cli always adds --workers 0)
    assert caption.cli([str(scenes[0]), "--checkpoint", str(checkpoint), "--workers", "1000", "--quiet"]) == 2
    assert "--workers" in one_line(capsys)


def test_attention_dir_that_cannot_be_created(scenes, checkpoint, tmp_path, capsys):  # noqa: F811
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    out = tmp_path / "out.jsonl"
    assert run_cli(scenes[0], "--checkpoint", checkpoint, "--attention-dir", blocker / "figs", "--output", out) == 2
    assert "--attention-dir" in one_line(capsys)
    assert not out.exists()  # refused before anything was written
    assert run_cli(scenes[0], "--checkpoint", checkpoint, "--attention-dir", blocker) == 2
    assert "not a folder" in one_line(capsys)


def test_empty_folder_is_one_line_and_non_zero(checkpoint, tmp_path, capsys):  # noqa: F811
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no images here")
    assert run_cli(tmp_path / "empty", "--checkpoint", checkpoint) == 2
    assert "no image found" in one_line(capsys)


# --------------------------------------------------------------------------------------------- hang or vanish

def test_fifos_sockets_and_broken_links_are_reported_never_opened(scenes, checkpoint, tmp_path):  # noqa: F811
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "good.jpg").write_bytes(scenes[0].read_bytes())
    os.mkfifo(folder / "pipe.png")
    os.symlink(tmp_path / "gone.jpg", folder / "broken.jpg")
    named_fifo = tmp_path / "named.jpg"
    os.mkfifo(named_fifo)
    expected = {"good.jpg": None, "pipe.png": "FIFO", "broken.jpg": "broken symbolic link", "named.jpg": "FIFO"}
    sock_path = folder / "s.png"
    if len(str(sock_path)) < 100:  # AF_UNIX path limit
        import socket

        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(sock_path))
        expected["s.png"] = "socket"
    out = tmp_path / "out.jsonl"
    # a child process with a timeout: before the fix, opening the FIFO blocked forever
    result = subprocess.run([sys.executable, "caption.py", str(folder), str(named_fifo), "--checkpoint",
                             str(checkpoint), "--output", str(out), "--workers", "0", "--quiet"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    records = read_jsonl(out)
    names = [Path(r["path"]).name for r in records]
    assert sorted(names) == sorted(expected)  # each once, none skipped
    for record in records:
        hint = expected[Path(record["path"]).name]
        if hint is None:
            assert record["tokens"] and "error" not in record
        else:
            assert hint in record["error"] and "caption" not in record, record


def test_tiny_image_says_why_its_caption_may_be_poor(checkpoint, tmp_path):  # noqa: F811
    Image.new("RGB", (1, 1), (200, 10, 10)).save(tmp_path / "tiny.png")
    out = tmp_path / "out.jsonl"
    assert run_cli(tmp_path / "tiny.png", "--checkpoint", checkpoint, "--output", out) == 0
    [record] = read_jsonl(out)
    assert "1x1 pixels" in record["warning"] and "upscaled" in record["warning"]
    if not record["tokens"]:
        assert "ended the caption at once" in record["warning"]


def test_empty_caption_gets_a_warning(scenes, checkpoint, tmp_path, monkeypatch):  # noqa: F811
    """A model that ends every caption at once: the record says so instead of a bare "caption": ""."""
    from captioner.batch.captioning import caption_paths
    from captioner.checkpoints.loading import load

    model = load(checkpoint)
    import torch

    with torch.no_grad():
        model.decoder.L_o.bias[model.vocab.end_index] += 1000.0  # <end> beats every word at the first step
    [record] = list(caption_paths(model, [scenes[0]], beam_size=1))
    assert record["caption"] == "" and "ended the caption at once" in record["warning"]
    assert "upscaled" not in record["warning"]  # the scene is not tiny


def test_csv_has_the_warning_column_and_old_csv_outputs_resume(scenes, checkpoint, tmp_path):  # noqa: F811
    Image.new("RGB", (2, 2)).save(tmp_path / "tiny.png")
    out = tmp_path / "out.csv"
    assert run_cli(tmp_path / "tiny.png", "--checkpoint", checkpoint, "--output", out) == 0
    header, row = out.read_text().splitlines()
    assert "warning" in header.split(",") and "upscaled" in row
    legacy = tmp_path / "legacy.csv"  # written by caption.py before the warning column
    legacy.write_text(f"path,caption,log_prob,error\n{scenes[0]},a red circle,-1.0,\n")
    assert run_cli(scenes[0], scenes[1], "--checkpoint", checkpoint, "--output", legacy) == 0
    lines = legacy.read_text().splitlines()
    assert lines[0] == "path,caption,log_prob,error" and len(lines) == 3
    assert lines[1] == f"{scenes[0]},a red circle,-1.0," and lines[2].count(",") == 3
