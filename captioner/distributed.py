"""Multi-process training (torchrun + DistributedDataParallel), mixed precision and crash-safe checkpoints.

``train.py`` calls into this module through small hooks; with one process every helper is a cheap no-op, so a
plain ``python train.py`` and ``torchrun --nproc_per_node=N train.py`` run the same code.

The run folder keeps its resumable state in ``last``: a symbolic link to a complete ``last-<step>-<tag>/``
folder. A new state is written to a fresh folder first and the link is switched with one ``os.replace``, so a
folder truncated by a crash mid-write is never the one ``last`` points to.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import random
import shutil
import signal
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from captioner.errors import CaptionerError, CheckpointError

# Fields that change the weights' shapes or meaning: a checkpoint that differs in one of them cannot be resumed.
ARCHITECTURE = ("encoder", "encoder_weights", "grid", "attention", "score", "value_projection", "channel_attention",
                "self_attention", "embed_dim", "hidden_dim", "attention_dim", "gate", "deep_output")
KILL_ENV = "CAPTIONER_TEST_KILL_AFTER_STEP"  # tests only: SIGKILL this process after that optimizer step


# --------------------------------------------------------------------------------------------- process group
@dataclass
class DistEnv:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1 and dist.is_available() and dist.is_initialized()


def resolve_device(flag: str, local_rank: int = 0) -> torch.device:
    """'auto' -> CUDA when present, else CPU; a bare 'cuda' becomes this process's GPU under torchrun."""
    if flag == "auto":
        flag = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(flag)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CaptionerError(f"--device {flag} asks for CUDA but no GPU is visible to torch.")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    return device


def setup(device_flag: str, timeout_minutes: float = 120.0) -> DistEnv:
    """Join the process group that torchrun describes (RANK, WORLD_SIZE, ...); one process without torchrun.

    NCCL on GPUs, gloo on CPUs. The long timeout lets rank 0 validate or score alone while the others wait.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_flag, local_rank)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method="env://", timeout=timedelta(minutes=timeout_minutes),
                                **({"device_id": device} if device.type == "cuda" else {}))
    return DistEnv(rank, world, local_rank, device)


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    if env.active:
        dist.barrier()


@contextlib.contextmanager
def rank0_first(env: DistEnv) -> Iterator[None]:
    """Rank 0 runs the block first (builds a cache, fetches weights); the others wait, then reuse its work."""
    if not env.is_main:
        barrier(env)
    yield
    if env.is_main:
        barrier(env)


def broadcast(env: DistEnv, obj):
    """Rank 0's ``obj`` on every rank (a picklable object)."""
    if not env.active:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_rank(env: DistEnv, *flags: bool) -> tuple[bool, ...]:
    """Each flag ORed over the ranks, so every rank takes the same branch (a lone rank would hang DDP)."""
    if not env.active:
        return tuple(bool(f) for f in flags)
    t = torch.tensor([float(f) for f in flags], device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(bool(v) for v in t.tolist())


def reduce_stats(env: DistEnv, stats: dict[str, float]) -> dict[str, float]:
    """Training metrics over all ranks: means of losses, sums of throughput (``captions_per_s``)."""
    if not env.active:
        return stats
    keys = sorted(stats)
    t = torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64, device=env.device)
    dist.all_reduce(t)
    summed = {"captions_per_s"}
    return {k: v if k in summed else v / env.world for k, v in zip(keys, t.tolist())}


def wrap_ddp(model: torch.nn.Module, env: DistEnv) -> torch.nn.Module:
    """The whole Captioner in DDP (frozen encoder parameters have requires_grad False and are skipped)."""
    if not env.active:
        return model
    from torch.nn.parallel import DistributedDataParallel

    # Hard attention's sampled and expected paths may leave parameters without a gradient on one rank.
    unused = getattr(getattr(model, "cfg", None), "attention", None) == "hard"
    return DistributedDataParallel(model, device_ids=[env.device.index] if env.device.type == "cuda" else None,
                                   find_unused_parameters=unused)


# --------------------------------------------------------------------------------------------- data order
class EpochSampler(Sampler[int]):
    """Shuffled, sharded and resumable: epoch ``e`` is ``randperm`` seeded with ``seed * 1000 + e``.

    ``set_epoch(e, consumed)`` skips the first ``consumed`` positions of that permutation (the samples all ranks
    have trained on, ``steps * batch_size * world``), then deals the rest to ranks round-robin like
    ``DistributedSampler`` (padded by repetition so every rank runs the same number of steps).
    """

    def __init__(self, size: int, rank: int = 0, world: int = 1, seed: int = 0, shuffle: bool = True):
        self.size, self.rank, self.world, self.seed, self.shuffle = size, rank, world, seed, shuffle
        self.epoch, self.consumed = 0, 0

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        self.epoch, self.consumed = epoch, min(max(consumed, 0), self._padded_size())

    def _padded_size(self) -> int:
        return -(-self.size // self.world) * self.world

    def order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
        order = self.order()
        order += order[: self._padded_size() - len(order)]  # the padding an uninterrupted epoch has
        rest = order[self.consumed:]
        rest += rest[: -len(rest) % self.world]  # only when the world size changed mid-epoch
        return iter(rest[self.rank::self.world])

    def __len__(self) -> int:
        return -(-(self._padded_size() - self.consumed) // self.world)


# --------------------------------------------------------------------------------------------- precision
class Precision:
    """``--amp bf16|fp16|off``: an autocast context for forward + loss, and a GradScaler for fp16 on CUDA."""

    def __init__(self, mode: str, device: torch.device):
        if mode not in ("off", "bf16", "fp16"):
            raise CaptionerError(f"--amp must be bf16, fp16 or off, not {mode!r}.")
        if mode == "fp16" and device.type != "cuda":
            raise CaptionerError("--amp fp16 needs a CUDA device; use --amp bf16 (or off) on the CPU.")
        self.mode, self.device_type = mode, device.type
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
        self.scaler = torch.amp.GradScaler("cuda") if mode == "fp16" else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


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
    from captioner.checkpoint import atomic_write, save_checkpoint

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

    def step_hook(self, epoch: int, consumed: int, counters, deadline: float | None = None):
        """``counters()`` -> best, bad_epochs, elapsed at call time; ``deadline``: a ``time.perf_counter`` value."""
        import time

        def on_step(done: int) -> bool:
            self.global_step += 1
            over_time = deadline is not None and time.perf_counter() > deadline
            signalled, over_time = any_rank(self.env, self.signals.received is not None, over_time)
            if signalled or (self.save_every and self.global_step % self.save_every == 0):
                self.save(epoch=epoch, consumed=consumed + done * self.batch_size * self.env.world, **counters())
            if signalled:
                self.stopped_by = self.signals.received or signal.SIGTERM
            maybe_kill_for_test(self.global_step)
            return signalled or over_time

        return on_step


# --------------------------------------------------------------------------------------------- compatibility
def check_run_folder(run: str | Path, wanted, defaults, resume: bool) -> None:
    """One clear error, before any work, when ``run`` holds a checkpoint of a different model than the flags ask.

    ``wanted``/``defaults``: ModelConfig from the flags and from the parser defaults. On ``--resume`` only the
    flags that were changed from their defaults are compared (the rest come from the checkpoint); a fresh run
    into a folder with a checkpoint of another architecture is refused rather than silently overwriting it.
    """
    import json

    run = Path(run)
    candidates = [latest_checkpoint(run)] if resume else [latest_checkpoint(run), run]
    for folder in candidates:
        if folder is None or not (folder / "config.json").is_file():
            continue
        try:
            saved = json.loads((folder / "config.json").read_text()).get("model", {})
        except (OSError, ValueError):
            raise CheckpointError(f"checkpoint {folder}: config.json is not valid JSON.") from None
        fields = [f for f in ARCHITECTURE if not resume or getattr(wanted, f) != getattr(defaults, f)]
        diff = [f"{f} {saved[f]!r} (flags ask {getattr(wanted, f)!r})" for f in fields
                if f in saved and saved[f] != getattr(wanted, f)]
        if diff:
            hint = "pass matching flags" if resume else "use another --out, or --resume with matching flags"
            where = run if folder == run else run / "last"
            raise CheckpointError(f"{where} holds a checkpoint of a different model: {', '.join(diff)}; {hint}.")
