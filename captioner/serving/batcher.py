"""Requests from many clients share one batched model call: a small bounded queue in front of the model.

Each request thread calls ``batcher.run(key, item)``; one worker thread takes the oldest waiting job and every other
waiting job with the same ``key`` (the same model and beam size: they can share one batched beam search), up to
``max_batch``, and hands them to ``run_batch(key, items)`` at once. While the model works on one batch the next one
gathers, so under load batches grow by themselves and a lone request never waits for company. Past ``max_waiting``
jobs a request is refused at once with ``Busy`` ("try again in a moment") instead of joining an unbounded wait. If a
batch fails, each of its jobs is run alone, so one bad input fails only its own request.

``call(fn, ...)`` runs any other function in the same worker thread, between batches: the app loads its models
there, so that torch only ever runs in that one thread. Each thread that runs torch's parallel operations keeps an
OpenMP team of its own, and a second team (the main thread's, from loading the model) made every batch in the
worker 1.7-2 times slower on 2 cores (bench/app_profile.py's in-process handler: about 82 ms against 41 ms).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from captioner.errors import CaptionerError

MAX_BATCH = 16  # images in one batched beam search
MAX_WAITING = 24  # jobs waiting for the model (not counting the batch it runs); more get Busy at once


class Busy(CaptionerError):
    """The model's queue is full: the request is refused at once instead of waiting without bound."""


class _Call:
    """The key of a ``Batcher.call`` job: a function to run alone in the worker thread (never batched)."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict):
        self.fn, self.args, self.kwargs = fn, args, kwargs


@dataclass
class _Job:
    key: Hashable
    item: Any
    future: Future = field(default_factory=Future)


class Batcher:
    """A bounded queue and one worker thread that runs waiting jobs of the same key as one batch."""

    def __init__(self, run_batch: Callable[[Hashable, list], Sequence], max_batch: int = MAX_BATCH,
                 max_waiting: int = MAX_WAITING, name: str = "batcher"):
        """``run_batch(key, items)`` returns one result per item, in order (an Exception instance fails only
        its own item)."""
        self.run_batch, self.max_batch, self.max_waiting = run_batch, max_batch, max_waiting
        self.name = name
        self._jobs: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._worker: threading.Thread | None = None
        self.running = 0  # jobs in the batch the model is running now
        self.batches = 0  # batches run so far, and the jobs in them (their mean size: jobs / batches)
        self.jobs = 0

    @property
    def waiting(self) -> int:
        """Jobs waiting for the model (the batch it is running not counted)."""
        return len(self._jobs)

    def report(self) -> dict:
        """What /healthz shows: the queue depth and its limit, the batch running, the mean batch size so far."""
        return {"waiting": self.waiting, "running": self.running, "max_waiting": self.max_waiting,
                "max_batch": self.max_batch, "batches": self.batches,
                "mean_batch": round(self.jobs / self.batches, 2) if self.batches else None}

    def submit(self, key: Hashable, item: Any) -> Future:
        """Queue one job; its future gets the result (or the exception). Raises ``Busy`` when the queue is full."""
        with self._cond:
            if len(self._jobs) >= self.max_waiting:
                raise Busy(f"the server is busy ({len(self._jobs)} images waiting for the model); "
                           "try again in a moment.")
            job = _Job(key, item)
            self._jobs.append(job)
            self._start_worker()
            self._cond.notify()
        return job.future

    def run(self, key: Hashable, item: Any, timeout: float | None = None) -> Any:
        """Submit and wait for the result (the job's own exception is raised here)."""
        return self.submit(key, item).result(timeout)

    def call(self, fn: Callable, *args, **kwargs) -> Any:
        """``fn(*args, **kwargs)`` run in the worker thread at its turn in the queue (never refused as busy,
        never batched); its result, or its exception raised here."""
        with self._cond:
            job = _Job(_Call(fn, args, kwargs), None)
            self._jobs.append(job)
            self._start_worker()
            self._cond.notify()
        return job.future.result()

    def _start_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name=self.name, daemon=True)
            self._worker.start()

    def _take(self) -> list[_Job]:
        """The oldest job and the other waiting jobs with its key, up to ``max_batch``, in arrival order."""
        first = self._jobs.popleft()
        batch, rest = [first], deque()
        while self._jobs:
            job = self._jobs.popleft()
            (batch if job.key == first.key and len(batch) < self.max_batch else rest).append(job)
        self._jobs.extendleft(reversed(rest))
        return batch

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:  # the thread lives as long as the process: a new one would mean a new team
                    self._cond.wait()
                batch = self._take()
                self.running = len(batch)
            try:
                live = [job for job in batch if job.future.set_running_or_notify_cancel()]
                self._run(live)
            finally:
                with self._cond:
                    self.running = 0
                    self.batches += 1
                    self.jobs += len(batch)

    def _run(self, batch: list[_Job]) -> None:
        if not batch:
            return
        if isinstance(batch[0].key, _Call):
            call = batch[0].key
            try:
                result = call.fn(*call.args, **call.kwargs)
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                result = error
            _settle(batch[0].future, result)
            return
        try:
            results = list(self.run_batch(batch[0].key, [job.item for job in batch]))
            if len(results) != len(batch):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} items")
        except BaseException as error:  # noqa: BLE001 - a failed batch: each job alone, so only the bad one fails
            if len(batch) > 1:
                for job in batch:
                    self._run_alone(job)
                return
            results = [error]
        for job, result in zip(batch, results):
            _settle(job.future, result)

    def _run_alone(self, job: _Job) -> None:
        try:
            result = self.run_batch(job.key, [job.item])[0]
        except BaseException as error:  # noqa: BLE001 - handed to the job's own request
            result = error
        _settle(job.future, result)


def _settle(future: Future, result: Any) -> None:
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def wait_until_idle(batcher: Batcher, timeout_s: float, poll_s: float = 0.01) -> bool:
    """Block until nothing waits or runs (True) or ``timeout_s`` passed (False); tests use it."""
    end = time.monotonic() + timeout_s
    while (batcher.waiting or batcher.running) and time.monotonic() < end:
        time.sleep(poll_s)
    return not (batcher.waiting or batcher.running)
