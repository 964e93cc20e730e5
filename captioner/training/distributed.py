"""Multi-process training (torchrun + DistributedDataParallel): the process group, the data order, DDP wrapping.

With one process every helper is a cheap no-op, so a plain ``python train.py`` and ``torchrun
--nproc_per_node=N train.py`` run the same code. Crash-safe run state lives in ``captioner.training.run_state``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from captioner.errors import CaptionerError


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
    """Shuffled, sharded and resumable: epoch ``e`` is ``randperm`` seeded with ``seed * 1000 + e`` (of the
    groups, with ``groups``: see ``__init__``).

    ``set_epoch(e, consumed)`` skips the first ``consumed`` positions of that permutation (the samples all ranks
    have trained on, ``steps * batch_size * world``), then deals the rest to ranks round-robin like
    ``DistributedSampler`` (padded by repetition so every rank runs the same number of steps).
    """

    def __init__(self, size: int, rank: int = 0, world: int = 1, seed: int = 0, shuffle: bool = True,
                 groups: list[list[int]] | None = None, batch_size: int | None = None):
        """``groups``: positions that stay together (the captions of each image): the groups are shuffled, each
        keeps its order, so consecutive batches hold whole groups (but one at a batch's edge). With ``batch_size``
        and several ranks, each round of ``batch_size * world`` positions is dealt in contiguous blocks, one batch
        per rank, so that a rank's batch keeps its images' captions together too (round-robin would leave each
        rank about 1 / world of a group); the last, partial round is dealt round-robin."""
        self.size, self.rank, self.world, self.seed, self.shuffle = size, rank, world, seed, shuffle
        self.groups, self.batch_size = groups, batch_size
        if groups is not None and sorted(i for g in groups for i in g) != list(range(size)):
            raise ValueError("EpochSampler groups must hold every position 0..size-1 once")
        self.epoch, self.consumed = 0, 0

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        self.epoch, self.consumed = epoch, min(max(consumed, 0), self._padded_size())

    def _padded_size(self) -> int:
        return -(-self.size // self.world) * self.world

    def order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size)) if self.groups is None else [i for g in self.groups for i in g]
        g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        if self.groups is not None:
            return [i for k in torch.randperm(len(self.groups), generator=g).tolist() for i in self.groups[k]]
        return torch.randperm(self.size, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
        order = self.order()
        order += order[: self._padded_size() - len(order)]  # the padding an uninterrupted epoch has
        rest = order[self.consumed:]
        rest += rest[: -len(rest) % self.world]  # only when the world size changed mid-epoch
        if self.groups is not None and self.batch_size and self.world > 1:  # whole batches per rank
            round_ = self.batch_size * self.world
            full = len(rest) // round_ * round_
            start = self.rank * self.batch_size
            mine = [i for s in range(0, full, round_) for i in rest[s + start: s + start + self.batch_size]]
            return iter(mine + rest[full:][self.rank::self.world])
        return iter(rest[self.rank::self.world])

    def __len__(self) -> int:
        return -(-(self._padded_size() - self.consumed) // self.world)
