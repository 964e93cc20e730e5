"""What a run folder keeps so training survives a crash: RNG state, signals, the ``last/`` folder, the
checkpointer that writes it, and the check that a run folder holds the same model.

The run folder keeps its resumable state in ``last``: a symbolic link to a complete ``last-<step>-<tag>/``
folder. A new state is written to a fresh folder first and the link is switched with one ``os.replace``, so a
folder truncated by a crash mid-write is never the one ``last`` points to.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import random
import shutil
import signal
import uuid
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from captioner.checkpoints import version1
from captioner.model.config import ModelConfig, shape_fields
from captioner.training.distributed import DistEnv, any_rank
from captioner.errors import CheckpointError
from captioner.training.loops import Precision  # noqa: F401 (type hints)

KILL_ENV = "CAPTIONER_TEST_KILL_AFTER_STEP"  # tests only: SIGKILL this process after that optimizer step


# --------------------------------------------------------------------------------------------- signals
class StopSignal:
    """SIGINT/SIGTERM set ``received``; the training loop then saves a checkpoint at the step end and exits.

    A second signal interrupts at once (KeyboardInterrupt).
    """

    def __init__(self):
        self.received: int | None = None
        self._previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: leave the handlers alone
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum
        print(f"\nsignal {signal.Signals(signum).name}: saving a checkpoint after this step", flush=True)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def maybe_kill_for_test(global_step: int) -> None:
    """Tests set CAPTIONER_TEST_KILL_AFTER_STEP to die like a crashed machine, mid-epoch."""
    target = os.environ.get(KILL_ENV)
    if target and global_step == int(target):
        os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------------------------- RNG and state
def rng_state() -> dict:
    """torch, CUDA, numpy and python RNG states as tensors/ints (loadable with ``weights_only=True``)."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(), "numpy_keys": torch.from_numpy(keys.astype(np.int64)),
             "numpy_pos": int(pos), "numpy_has_gauss": int(has_gauss), "numpy_gauss": float(gauss),
             "python_version": version, "python_internal": torch.tensor(internal, dtype=torch.int64),
             "python_gauss": gauss_next}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), state["numpy_pos"],
                         state["numpy_has_gauss"], state["numpy_gauss"]))
    random.setstate((state["python_version"], tuple(state["python_internal"].tolist()), state["python_gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def capture_state(env: DistEnv, optimizer: torch.optim.Optimizer, precision: Precision | None = None,
                  hard=None, **counters) -> dict:
    """Everything but the weights that a resume needs; per-rank parts (RNG, hard baseline) from every rank.

    Collective: every rank must call it (rank 0's result is the one to save).
    """
    mine = {"rng": rng_state(), "hard": hard.state_dict() if hard is not None else {}}
    if env.active:
        ranks = [None] * env.world
        dist.all_gather_object(ranks, mine)
    else:
        ranks = [mine]
    state = {"optimizer": optimizer.state_dict(), "ranks": ranks, "world": env.world, **counters}
    if precision is not None and precision.scaler is not None:
        state["scaler"] = precision.scaler.state_dict()
    return state


def restore_state(env: DistEnv, state: dict, optimizer: torch.optim.Optimizer, precision: Precision | None = None,
                  hard=None) -> None:
    """Inverse of ``capture_state`` for this rank; RNG last, so nothing drawn afterwards shifts it."""
    optimizer.load_state_dict(state["optimizer"])
    if precision is not None and precision.scaler is not None and "scaler" in state:
        precision.scaler.load_state_dict(state["scaler"])
    ranks = state.get("ranks")
    if ranks:
        mine = ranks[env.rank] if len(ranks) == env.world else ranks[0]
        if hard is not None:
            hard.load_state_dict(mine.get("hard", {}))
        set_rng_state(mine["rng"])
        if len(ranks) != env.world:  # a different world size: keep the ranks' dropout streams apart
            torch.manual_seed(int(torch.randint(0, 2**31, ())) + env.rank)
    elif "torch_rng" in state:  # written before this module existed
        if hard is not None:
            hard.load_state_dict(state.get("hard", {}))
        torch.set_rng_state(state["torch_rng"])


# --------------------------------------------------------------------------------------------- last/ folder
def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in ("config.json", "vocab.json", "model.safetensors",
                                                      "train_state.pt"))


def latest_checkpoint(run: str | Path) -> Path | None:
    """The folder ``run/last`` points to, if it is complete; never a ``last-*`` folder left half-written."""
    link = Path(run) / "last"
    if not (link.is_symlink() or link.is_dir()):
        return None
    folder = link.resolve()
    return folder if folder.is_dir() and _complete(folder) else None


def save_last(run: str | Path, model, state: dict) -> Path:
    """Write weights + training state to a new ``last-<step>-<tag>/`` and switch ``run/last`` to it atomically."""
    from captioner.checkpoints.folder import atomic_write, save_checkpoint

    run = Path(run)
    run.mkdir(parents=True, exist_ok=True)
    name = f"last-{int(state.get('global_step', 0)):09d}-{uuid.uuid4().hex[:6]}"
    folder = run / name
    save_checkpoint(model, folder)
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write(folder / "train_state.pt", buf.getvalue())
    _fsync_dir(folder)
    link, tmp_link = run / "last", run / f".{name}.link"
    if link.is_dir() and not link.is_symlink():  # a plain folder from an older train.py: set it aside first
        os.replace(link, run / f"last-legacy-{uuid.uuid4().hex[:6]}")
    os.symlink(name, tmp_link)
    os.replace(tmp_link, link)  # the switch: `last` names the old complete folder or the new one, nothing between
    _fsync_dir(run)
    for stale in run.glob("last-*"):  # the previous state and folders of crashed writes
        if stale.name != name and stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    for stale in run.glob(".last-*.link"):
        stale.unlink(missing_ok=True)
    return folder


def load_train_state(folder: str | Path) -> dict:
    path = Path(folder) / "train_state.pt"
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # weights_only refused pickled code (it never ran): one line, no traceback
        raise CheckpointError(f"training state {path} holds Python objects that are not plain tensors; it was "
                              "refused without running them.") from None
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        raise CheckpointError(f"cannot read training state {path} ({str(e).splitlines()[0] if str(e) else e!r}).") from None


class Checkpointer:
    """Saves ``run/last`` at epoch ends, every ``save_every`` optimizer steps and when a signal arrives.

    ``step_hook`` gives ``train_one_epoch`` its ``on_step``: it counts steps, agrees with the other ranks on
    stopping (signal or time limit) and writes the state. Only rank 0 writes; every rank gathers.
    """

    def __init__(self, env: DistEnv, run: str | Path, model, optimizer, precision: Precision | None, hard,
                 save_every: int = 0, batch_size: int = 1, global_step: int = 0):
        self.env, self.run, self.model, self.optimizer = env, Path(run), model, optimizer
        self.precision, self.hard, self.save_every, self.batch_size = precision, hard, save_every, batch_size
        self.global_step = global_step
        self.signals = StopSignal()
        self.stopped_by: int | None = None  # the signal that stopped training, agreed by all ranks

    def save(self, **counters) -> None:
        state = capture_state(self.env, self.optimizer, self.precision, self.hard, global_step=self.global_step,
                              **counters)
        if self.env.is_main:
            save_last(self.run, getattr(self.model, "module", self.model), state)

    def step_hook(self, epoch: int, consumed: int, counters, deadline: float | None = None, clock=None):
        """``counters()`` -> best, bad_epochs, elapsed at call time; ``deadline``: a value of ``clock``
        (default ``time.perf_counter``)."""
        import time

        clock = clock or time.perf_counter

        def on_step(done: int) -> bool:
            self.global_step += 1
            over_time = deadline is not None and clock() > deadline
            signalled, over_time = any_rank(self.env, self.signals.received is not None, over_time)
            if signalled or (self.save_every and self.global_step % self.save_every == 0):
                self.save(epoch=epoch, consumed=consumed + done * self.batch_size * self.env.world, **counters())
            if signalled:
                self.stopped_by = self.signals.received or signal.SIGTERM
            maybe_kill_for_test(self.global_step)
            return signalled or over_time

        return on_step


# --------------------------------------------------------------------------------------------- compatibility
def saved_model_config(folder: Path) -> dict | None:
    """The ``model`` part of ``folder/config.json``, or None when the folder holds no checkpoint."""
    if not (folder / "config.json").is_file():
        return None
    try:
        model = json.loads((folder / "config.json").read_text()).get("model", {})
        return version1.split(model)[0] if version1.is_flat(model) else model  # a version-1 checkpoint's flat form
    except (OSError, ValueError, AttributeError, TypeError):
        raise CheckpointError(f"checkpoint {folder}: config.json is not valid JSON.") from None


def check_run_folder(run: str | Path, wanted: ModelConfig, resume: bool, given: set[str] | None = None) -> None:
    """One clear error, before any work, when ``run`` holds a checkpoint that the settings would contradict.

    A fresh run into a folder holding a checkpoint of another architecture (any field marked ``SHAPE`` in
    ``ModelConfig``) is refused rather than silently overwriting it. On resume the model comes from the
    checkpoint; ``given`` names the model fields set explicitly (None: every field) and each one that differs
    from the checkpoint's is an error, never silently ignored.
    """
    run = Path(run)
    candidates = [latest_checkpoint(run)] if resume else [latest_checkpoint(run), run]
    for folder in candidates:
        saved = saved_model_config(folder) if folder is not None else None
        if saved is None:
            continue
        names = [f for f in ModelConfig.__dataclass_fields__ if given is None or f in given] if resume \
            else list(shape_fields())
        names = [f for f in names if f not in ("vocab_size", "encoder_channels")]
        diff = [f"{f} {saved[f]!r} (asked: {getattr(wanted, f)!r})" for f in names
                if f in saved and saved[f] != getattr(wanted, f)]
        if diff:
            hint = ("drop those flags: a resumed run keeps its checkpoint's model" if resume
                    else "use another --out, or --resume to continue it")
            where = run if folder == run else run / "last"
            raise CheckpointError(f"{where} holds a checkpoint of a different model: {', '.join(diff)}; {hint}.")


def budget_clock(kind: str, threads: int | None):
    """The clock ``--time-limit`` counts in seconds: ``wall`` (``time.perf_counter``) or ``cpu``, the process's CPU
    time over its torch threads: on a machine shared with other work, about the wall time the run would need alone."""
    import time

    if kind == "wall":
        return time.perf_counter
    share = max(1, threads or torch.get_num_threads())
    return lambda: time.process_time() / share
