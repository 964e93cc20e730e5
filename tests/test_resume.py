"""Crash-safe training: SIGKILL mid-epoch + --resume equals an uninterrupted run; `last` is never a torn folder."""

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from captioner.training import run_state
from captioner.checkpoints.folder import save_checkpoint
from captioner.model.config import ModelConfig
from captioner.errors import CheckpointError
from captioner.model.captioner import Captioner
from captioner.vocab import Vocabulary

ROOT = Path(__file__).resolve().parents[1]
VOCAB = Vocabulary(["a", "red", "blue", "circle", "square"])


def train_cmd(shapes_json, out, *extra) -> list[str]:
    return [sys.executable, "train.py", "--dataset", str(shapes_json), "--encoder", "small_cnn",
            "--encoder-weights", "none", "--embed-dim", "16", "--hidden-dim", "32", "--attention-dim", "16",
            "--max-train-images", "8", "--max-val-images", "2", "--batch-size", "8", "--epochs", "2",
            "--min-word-count", "1", "--save-every", "2", "--test-splits", "", "--no-progress", "--threads", "1",
            "--device", "cpu", "--out", str(out), *extra]


def run(cmd, **env) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, **env})


@pytest.mark.integration
def test_sigkill_mid_epoch_then_resume_matches_uninterrupted_run(tmp_path, shapes_json):
    whole, crashed = tmp_path / "whole", tmp_path / "crashed"
    proc = run(train_cmd(shapes_json, whole))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 40 captions / batch 8 = 5 steps an epoch; die after step 7 (epoch 2), one step after the save at step 6
    proc = run(train_cmd(shapes_json, crashed), **{run_state.KILL_ENV: "7"})
    assert proc.returncode == -signal.SIGKILL
    state = torch.load(crashed / "last" / "train_state.pt", weights_only=True)
    assert (state["epoch"], state["consumed"], state["global_step"]) == (1, 8, 6)
    proc = run(train_cmd(shapes_json, crashed, "--resume"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "epoch 2, 8 captions done, step 6" in proc.stdout
    # the resumed epoch's logged loss covers all of its steps, the ones before the kill too
    rows = [[json.loads(line)["train"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            for run_dir in (whole, crashed)]
    for key in ("loss", "ce", "ds"):
        assert [r[key] for r in rows[1]] == pytest.approx([r[key] for r in rows[0]], rel=1e-6), key
    a, b = load_file(whole / "last" / "model.safetensors"), load_file(crashed / "last" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-6, msg=name)


def tiny_model() -> Captioner:
    return Captioner(ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=32, embed_dim=16,
                                 attention_dim=16), VOCAB)


def test_folder_truncated_mid_write_is_never_latest(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    assert run_state.latest_checkpoint(run_dir) is None
    model = tiny_model()
    first = run_state.save_last(run_dir, model, {"global_step": 1, "epoch": 0})
    assert run_state.latest_checkpoint(run_dir) == first.resolve()
    # a crash halfway through the next save: weights written, training state not
    import captioner.checkpoints.folder as checkpoint

    real_write = checkpoint.atomic_write

    def crash_on_state(path, data):
        if Path(path).name == "train_state.pt":
            Path(path).write_bytes(b"trunc")  # a torn file, as a kill between write and rename could leave
            raise KeyboardInterrupt
        real_write(path, data)

    monkeypatch.setattr(checkpoint, "atomic_write", crash_on_state)
    with pytest.raises(KeyboardInterrupt):
        run_state.save_last(run_dir, model, {"global_step": 2, "epoch": 0})
    monkeypatch.setattr(checkpoint, "atomic_write", real_write)
    torn = [p for p in run_dir.glob("last-000000002-*")]
    assert len(torn) == 1 and (torn[0] / "model.safetensors").is_file()
    # also a folder whose files are all there but cut short, newer by name
    cut = run_dir / "last-999999999-cut"
    cut.mkdir()
    for f in first.iterdir():
        (cut / f.name).write_bytes(f.read_bytes()[:10])
    assert run_state.latest_checkpoint(run_dir) == first.resolve()
    assert run_state.load_train_state(run_state.latest_checkpoint(run_dir))["global_step"] == 1
    third = run_state.save_last(run_dir, model, {"global_step": 3, "epoch": 1})
    assert run_state.latest_checkpoint(run_dir) == third.resolve()
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(["last", third.name])  # torn ones cleaned up


def test_plain_last_folder_from_older_runs_is_read_then_replaced(tmp_path):
    run_dir = tmp_path / "run"
    legacy = run_dir / "last"
    save_checkpoint(tiny_model(), legacy)
    torch.save({"epoch": 1}, legacy / "train_state.pt")
    assert run_state.latest_checkpoint(run_dir) == legacy.resolve()
    new = run_state.save_last(run_dir, tiny_model(), {"global_step": 5})
    assert (run_dir / "last").is_symlink() and run_state.latest_checkpoint(run_dir) == new.resolve()


def test_rng_states_round_trip_through_weights_only_load(tmp_path):
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    path = tmp_path / "rng.pt"
    torch.save(run_state.rng_state(), path)
    expected = (random.random(), np.random.rand(), torch.rand(()).item())
    run_state.set_rng_state(torch.load(path, weights_only=True))
    assert (random.random(), np.random.rand(), torch.rand(()).item()) == expected


def test_incompatible_checkpoint_is_one_clear_error_before_any_work(tmp_path):
    run_dir = tmp_path / "run"
    save_checkpoint(tiny_model(), run_dir)
    proc = run([sys.executable, "train.py", "--dataset", str(tmp_path / "no-such-dataset.json"), "--encoder",
                "small_cnn", "--encoder-weights", "none", "--embed-dim", "16", "--hidden-dim", "64",
                "--attention-dim", "16", "--device", "cpu", "--out", str(run_dir)])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"train.py: error: {run_dir} holds a checkpoint of a different model: hidden_dim 32 (asked: 64); use another "
        "--out, or --resume to continue it."]
    wanted = ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=32, embed_dim=16, attention_dim=16)
    run_state.check_run_folder(run_dir, wanted, resume=False)  # same model: fine
    with pytest.raises(CheckpointError, match="attention_dim 16"):
        run_state.check_run_folder(run_dir, ModelConfig(encoder="small_cnn", encoder_weights=None,
                                                        attention_dim=24), resume=False)


def test_shape_fields_come_from_the_dataclass():
    """Every field that changes a weight's shape is checked; the stale hand-kept list lacked these three."""
    from captioner.model.config import shape_fields

    assert {"positional", "location", "word_query", "hidden_dim", "attention", "encoder"} <= set(shape_fields())
    assert not {"dropout", "max_len", "vocab_size", "hard_inference"} & set(shape_fields())


def _error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.integration  # a train.py process (test_incompatible_checkpoint_... keeps one in the fast tier)
def test_fresh_run_with_word_query_into_a_folder_with_another_model_is_refused(tmp_path, shapes_json):
    """Bug: --word-query (missing from the hand-kept list) overwrote a checkpoint without it."""
    run_dir = tmp_path / "run"
    run_state.save_last(run_dir, tiny_model(), {"global_step": 1, "epoch": 1})
    save_checkpoint(tiny_model(), run_dir)
    before = (run_dir / "model.safetensors").read_bytes()
    proc = run(train_cmd(shapes_json, run_dir, "--word-query"))
    assert "word_query False (asked: True)" in _error_line(proc)
    assert (run_dir / "model.safetensors").read_bytes() == before


@pytest.mark.integration  # a train.py process (test_incompatible_checkpoint_... keeps one in the fast tier)
def test_resume_with_a_contradicting_model_flag_is_refused(tmp_path, shapes_json):
    """Bug: --resume --location was silently ignored (the model came from the checkpoint, without it)."""
    run_dir = tmp_path / "run"
    run_state.save_last(run_dir, tiny_model(), {"global_step": 1, "epoch": 1})
    line = _error_line(run(train_cmd(shapes_json, run_dir, "--resume", "--location")))
    assert "location False (asked: True)" in line


@pytest.mark.integration
def test_resumed_hard_run_keeps_its_objective_without_repeating_flags(tmp_path, shapes_json):
    """Bug: resuming a hard-attention run without --attention hard trained it without REINFORCE and entropy."""
    run_dir = tmp_path / "hard"
    hard = ("--attention", "hard", "--sample-prob", "1.0")
    proc = run(train_cmd(shapes_json, run_dir, *hard), **{run_state.KILL_ENV: "7"})  # dies in epoch 2
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    proc = run(train_cmd(shapes_json, run_dir, "--resume"))  # no model or objective flags
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    assert {"reinforce", "entropy"} <= rows[0]["train"].keys()
    assert rows[1]["train"].keys() == rows[0]["train"].keys()


@pytest.mark.integration
def test_resume_keeps_the_checkpoints_caption_order_over_a_recipes(tmp_path, shapes_json):
    """Bug: ``--resume --config shapes-soft`` (a number_last recipe) on a run trained with the number word
    first rewrote the captions for the recipe and stopped with "the vocabulary ... does not match"."""
    run_dir = tmp_path / "run"
    proc = run(train_cmd(shapes_json, run_dir), **{run_state.KILL_ENV: "7"})  # dies in epoch 2
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("[model]\nnumber_last = true\n")  # what the recipe says; the checkpoint says otherwise
    proc = run(train_cmd(shapes_json, run_dir, "--resume", "--config", str(recipe)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.loads((run_dir / "config.json").read_text())["model"]
    assert saved["plugin_config"].get("number_last", False) is False
