"""A command words its help and its errors the same way whichever way it is started: ``python -m`` runs the same
``cli()`` as the console script, and a parser names the program it was invoked as."""

import subprocess
import sys
from pathlib import Path

import pytest

from captioner.commands import caption as caption_command
from captioner.batch.preflight import MAX_BEAM_SIZE

ROOT = Path(__file__).resolve().parents[1]


def test_caption_help_names_the_program_it_was_invoked_as(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/captioner-caption", "--help"])
    with pytest.raises(SystemExit) as exited:
        caption_command.cli(["--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: captioner-caption ")


def test_train_help_names_the_program_it_was_invoked_as(monkeypatch, capsys):
    from captioner.commands import train as train_command

    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/captioner-train", "--help"])
    with pytest.raises(SystemExit) as exited:
        train_command.cli(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: captioner-train ") and "--domain-images" in out


def test_caption_error_names_the_program_it_was_invoked_as(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["captioner-caption"])
    assert caption_command.cli(["image.png", "--beam-size", "0"]) == 2
    assert capsys.readouterr().err == (f"captioner-caption: error: --beam-size must be from 1 to {MAX_BEAM_SIZE}, "
                                       "not 0.\n")


@pytest.mark.parametrize("module, args, prog", [
    ("captioner.evaluate", ["--checkpoint", "{missing}"], "captioner-evaluate"),
    ("captioner.data.prepare", ["karpathy", "--json", "{missing}/d.json", "--images", "{missing}", "--name", "x"],
     "captioner-prepare"),
])
@pytest.mark.integration
def test_python_m_words_a_user_error_like_the_console_script(tmp_path, module, args, prog):
    missing = tmp_path / "missing"
    done = subprocess.run([sys.executable, "-m", module, *[a.format(missing=missing) for a in args]], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: ") and str(missing) in lines[0], done.stderr


@pytest.mark.parametrize("argv", [
    ["caption.py", "--beam-size", "x", "img.png"],
    ["train.py", "--no-such-flag"],
    ["-m", "captioner.data.prepare", "own", "--captions", "x.csv"],
    ["-m", "captioner.evaluate", "--split"],
])
@pytest.mark.integration
def test_a_bad_flag_is_one_line_without_the_usage_block(argv):
    result = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "error:" in lines[0] and "usage:" not in result.stderr


@pytest.mark.parametrize("module", ["captioner.data.prepare", "captioner.scenes.shapes", "captioner.data.download",
                                    "captioner.export", "captioner.evaluate", "captioner.commands.app",
                                    "captioner.commands.train"])
@pytest.mark.integration
def test_python_m_help_is_clean(module):
    """A module run with ``python -m`` must not already be imported by the package: runpy warns on stderr, and a
    one-line error becomes two (a scene module once pulled the shapes CLI in through metrics)."""
    res = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", module, "--help"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
