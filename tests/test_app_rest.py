"""POST /v1/explain: the image as the request body, the /explain JSON in the same response; bad input gets 400
and one sentence, a full queue 503, another method 405; only the checkpoints the app serves."""

from __future__ import annotations

import asyncio
import json

import pytest

from captioner.serving import Batcher, Busy
from captioner.serving.rest import RestApi
from test_app import make_checkpoint, make_images


def request(app, method: str, path: str, body: bytes = b"", query: str = "", chunk: int = 0) -> tuple[int, dict]:
    """One request through an ASGI app, the body in pieces of ``chunk`` bytes (0: whole): (status, JSON)."""
    pieces = [body[i:i + chunk] for i in range(0, len(body), chunk)] if chunk else [body]
    sent = []

    async def receive():
        piece = pieces.pop(0) if pieces else b""
        return {"type": "http.request", "body": piece, "more_body": bool(pieces)}

    async def send(message):
        sent.append(message)

    async def behind(scope, receive, send):  # the app behind the route (Gradio in the server)
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b'{"behind": true}'})

    scope = {"type": "http", "method": method, "path": path, "query_string": query.encode(), "headers": []}
    asyncio.run(RestApi(behind, app)(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from captioner.commands import app as app_impl

    root = tmp_path_factory.mktemp("rest")
    folder = make_checkpoint(root / "ckpt")
    app_impl.build_demo({"tiny": folder}, examples=[])
    return app_impl, make_images(root / "images")


def test_the_body_is_captioned_as_the_gradio_api_captions_it(served):
    app_impl, images = served
    data = images[0].read_bytes()
    status, answer = request(app_impl.rest_explain, "POST", "/v1/explain", data, "beam_size=2", chunk=100)
    expected = app_impl.explain_json(str(images[0]), 2, "tiny")
    assert status == 200
    assert answer["text"] == expected["text"] and answer["checkpoint"] == "tiny" and "alphas" not in answer
    assert answer["word_probs"] == pytest.approx(expected["word_probs"], abs=1e-6)
    status, with_maps = request(app_impl.rest_explain, "POST", "/v1/explain/", data, "alphas=1&checkpoint=tiny")
    assert status == 200 and len(with_maps["alphas"]) == len(with_maps["tokens"])


@pytest.mark.parametrize("body, query, words", [
    (b"", "", "no image given"),
    (b"not an image", "", "the request body: not an image file"),
    (None, "beam_size=99", "beam size '99'"),
    (None, "checkpoint=/etc", "not served here; choose one of: tiny"),
    (None, "regions=[1,2", "regions must be JSON"),
])
def test_bad_input_gets_400_and_one_sentence(served, body, query, words):
    app_impl, images = served
    status, answer = request(app_impl.rest_explain, "POST", "/v1/explain",
                             images[1].read_bytes() if body is None else body, query)
    assert status == 400 and words in answer["error"] and "\n" not in answer["error"]
    assert "Traceback" not in answer["error"] and "/" not in answer["error"].replace("/etc", "")


def test_a_full_queue_is_503_and_other_paths_and_methods_are_not_taken(served, monkeypatch):
    app_impl, images = served

    def refuse(key, item):
        raise Busy("the server is busy (24 images waiting for the model); try again in a moment.")

    monkeypatch.setattr(app_impl.BATCHER, "submit", refuse)
    status, answer = request(app_impl.rest_explain, "POST", "/v1/explain", images[0].read_bytes())
    assert status == 503 and "try again" in answer["error"]
    assert request(app_impl.rest_explain, "GET", "/v1/explain")[0] == 405
    assert request(app_impl.rest_explain, "POST", "/gradio_api/run/explain") == (299, {"behind": True})


def test_a_bug_is_500_without_its_details():
    def broken(body, query):
        raise RuntimeError("/secret/path exploded")

    status, answer = request(broken, "POST", "/v1/explain", b"x")
    assert status == 500 and "secret" not in answer["error"]


def test_the_model_runs_in_the_batchers_thread_only(served, monkeypatch):
    import threading

    app_impl, images = served
    batcher = Batcher(app_impl._run_batch, name="model-thread")
    monkeypatch.setattr(app_impl, "BATCHER", batcher)
    seen = []
    real = app_impl.explain_batch
    monkeypatch.setattr(app_impl, "explain_batch", lambda *a, **k: seen.append(threading.current_thread().name)
                        or real(*a, **k))
    assert request(app_impl.rest_explain, "POST", "/v1/explain", images[0].read_bytes())[0] == 200
    assert seen == ["model-thread"]


def test_a_lone_request_gets_every_thread_and_a_batch_under_load_one_fewer(monkeypatch):
    import torch

    from captioner.commands import app as app_impl

    monkeypatch.setattr(app_impl, "_ALL_THREADS", 2)
    own = Batcher(lambda key, items: items)  # a thread of its own: this one's torch threads stay as they are

    def threads_for(alone: bool) -> int:
        app_impl._set_threads(alone)
        return torch.get_num_threads()

    assert own.call(threads_for, True) == 2 and own.call(threads_for, False) == 1
    monkeypatch.setattr(app_impl, "THREADS", 3)  # --threads 3 holds either way
    assert own.call(threads_for, True) == 3 and own.call(threads_for, False) == 3
