"""/healthz and the clean shutdown: requests in flight finish on SIGTERM, new work gets a quick 503."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from captioner.serving import Health, ServerState

ROOT = Path(__file__).resolve().parent.parent


def request(app, method: str, path: str) -> tuple[int, bytes]:
    """One request through an ASGI app: (status, body)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app({"type": "http", "method": method, "path": path, "headers": []}, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_healthz_counts_requests_in_flight_and_refuses_new_work_while_draining():
    state = ServerState(models=lambda: {"soft": True}, queue=lambda: {"waiting": 0})
    seen = []

    async def inner(scope, receive, send):  # the app behind: records the in-flight count it runs under
        seen.append(state.in_flight)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    app = Health(inner, state)
    status, body = request(app, "GET", "/healthz")
    assert status == 200 and json.loads(body) == {"status": "ok", "models": {"soft": True}, "in_flight": 0,
                                                 "queue": {"waiting": 0}}
    assert request(app, "POST", "/gradio_api/queue/join") == (200, b"done") and seen == [1]
    assert state.in_flight == 0 and state.wait_idle(0.1)
    state.draining = True
    for path in ("/gradio_api/queue/join", "/v1/explain"):  # Gradio's new work, and the app's own route
        status, body = request(app, "POST", path)
        assert status == 503 and b"shutting down" in body
    assert request(app, "GET", "/gradio_api/queue/data")[0] == 200  # the stream of work already joined
    assert request(app, "GET", "/gradio_api/call/caption/abc")[0] == 200
    status, body = request(app, "GET", "/healthz")
    assert status == 503 and json.loads(body)["status"] == "draining"
    state.in_flight = 1
    assert not state.wait_idle(0.1)  # a request still running: the wait says so when its time is up


@pytest.mark.integration  # starts the app in its own process
def test_sigterm_stops_the_app_cleanly(tmp_path):
    import httpx

    from test_app import free_port, make_checkpoint

    checkpoint = make_checkpoint(tmp_path / "ckpt")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "app.py", "--checkpoint", str(checkpoint), "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        health = None
        for _ in range(240):  # the app imports torch and gradio, then loads the checkpoint: up to a minute
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.25)
        assert health is not None and health.status_code == 200, proc.stderr.read() if proc.poll() else "no answer"
        report = health.json()
        assert {k: report[k] for k in ("status", "models", "in_flight")} == {
            "status": "ok", "models": {"ckpt": True}, "in_flight": 0}
        assert report["queue"]["waiting"] == 0 and report["queue"]["max_waiting"] > 0  # the model's queue
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
        assert "SIGTERM: requests finished; stopping." in err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_memory_trimmer_hands_freed_memory_back_until_stopped():
    from captioner.serving.memory import MemoryTrimmer, release_freed_memory

    assert isinstance(release_freed_memory(), bool)  # True where glibc had pages to give back
    trimmer = MemoryTrimmer(interval_s=0.01).start()
    deadline = time.monotonic() + 10
    while trimmer.trims < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    trimmer.stop()
    assert trimmer.trims >= 3
    stopped_at = trimmer.trims
    time.sleep(0.1)
    assert trimmer.trims <= stopped_at + 1  # at most the round that was running
