"""ASGI middleware bounding what requests may bring (a body size limit whatever the route, an upload quota on the
folder uploads land in), and the server's health and clean shutdown (``Health``, ``ServerState``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


class BodySizeLimit:
    """ASGI middleware: a request whose body is over ``max_bytes`` gets 413 (by Content-Length, or while streaming)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await self._refuse(send)
        seen, started, refused = 0, False, False

        async def limited_receive():
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    refused = True
                    if not started:
                        await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message):
            nonlocal started
            if refused:
                return  # the 413 was sent already
            started = started or message["type"] == "http.response.start"
            await send(message)

        return await self.app(scope, limited_receive, tracking_send)

    async def _refuse(self, send) -> None:
        body = (f'{{"detail": "request body over the limit of {self.max_bytes // 2**20} MB"}}').encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def folder_bytes(folder: str | Path) -> int:
    """Total size of the regular files under ``folder`` (0 when it is missing)."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.stat(os.path.join(root, name), follow_symlinks=False).st_size
            except OSError:
                pass
    return total


class UploadQuota:
    """ASGI middleware: an upload (a POST to a path ending in ``/upload``) is refused with 507 while ``folder``
    already holds ``max_bytes``, so uploads that never reach the model cannot fill the disk before the cache
    cleanup removes them. The folder is measured at most every ``rescan_s`` seconds; in between, the bodies of the
    uploads let through are added to the last measure (an upper bound: files only leave the folder)."""

    def __init__(self, app, folder: str | Path, max_bytes: int, rescan_s: float = 10.0):
        self.app, self.folder, self.max_bytes, self.rescan_s = app, Path(folder), max_bytes, rescan_s
        self._measured, self._measured_at = 0, float("-inf")

    def held_bytes(self, now: float | None = None) -> int:
        """The folder's size: measured when the last measure is older than ``rescan_s``, else the running total."""
        now = time.monotonic() if now is None else now
        if now - self._measured_at >= self.rescan_s:
            self._measured, self._measured_at = folder_bytes(self.folder), now
        return self._measured

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path", "").endswith("/upload"):
            if self.held_bytes() >= self.max_bytes:
                body = b'{"detail": "the server holds too many uploads; try again later"}'
                await send({"type": "http.response.start", "status": 507,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
            length = dict(scope.get("headers") or []).get(b"content-length", b"")
            self._measured += int(length) if length.isdigit() else 0  # counted before the next measure
        await self.app(scope, receive, send)


class ServerState:
    """What ``/healthz`` reports and what a clean shutdown waits for: requests in flight, and whether the server
    is draining (a SIGTERM arrived: no new work, the requests in flight finish)."""

    def __init__(self, models=lambda: {}, queue=lambda: {}):
        self.models = models  # () -> {short name: loaded?}
        self.queue = queue  # () -> the model queue's report (waiting, running, its bound, batches)
        self.in_flight = 0
        self.draining = False

    def report(self) -> dict:
        return {"status": "draining" if self.draining else "ok", "models": self.models(), "in_flight": self.in_flight,
                "queue": self.queue()}

    def wait_idle(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Block until no request is in flight (True) or ``timeout_s`` passed (False)."""
        end = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < end:
            time.sleep(poll_s)
        return not self.in_flight


# The routes whose POST starts new work (Gradio's: a prediction joining the queue, an upload, a direct call; the
# app's own /v1/explain); while draining they are refused, while the streams of work already started (GET
# queue/data, GET call/<api>/<event>) and file downloads are served to the end.
NEW_WORK = ("/queue/join", "/upload", "/call/", "/run/", "/v1/")


class Health:
    """ASGI middleware: ``GET /healthz`` answers ``state.report()`` as JSON (503 while draining), every other
    request is counted in flight while it runs, and while draining new work is refused at once with 503."""

    def __init__(self, app, state: ServerState, path: str = "/healthz"):
        self.app, self.state, self.path = app, state, path

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if path.rstrip("/") == self.path:
            return await _json(send, 503 if self.state.draining else 200, self.state.report())
        if self.state.draining and scope.get("method") == "POST" and any(part in path for part in NEW_WORK):
            return await _json(send, 503, {"detail": "the server is shutting down; try again in a moment"})
        self.state.in_flight += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1


async def _json(send, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
