"""The app's plain HTTP route beside Gradio's API: ``POST /v1/explain`` takes the image as the request body and
answers the ``/explain`` JSON in the same response.

    curl --data-binary @photo.jpg "http://127.0.0.1:7860/v1/explain?beam_size=3"

Gradio's own routes cost a program more than the model does: its queued API is two requests (a call, then its
event stream), and every call, queued or direct, builds a session holding a copy of the page's configuration. This
route is ASGI middleware in front of Gradio: the body is read here, and the handler runs in a worker thread
and queues the image for the model's batcher like every other request. The body-size limit, the health counters and the
drain on shutdown still apply, since the app places this inside them.

Query parameters: ``beam_size`` (default 3), ``checkpoint`` (a short name the app serves; default: its first),
``alphas`` (``1``: each word's attention map too), ``regions`` (JSON boxes that steer the caption: docs/regions.md).
Answers: 200 with the JSON; 400 with ``{"error": one sentence}`` for bad input (not an image, a bad parameter);
503 when the model's queue is full; 405 for a method other than POST.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qsl

import anyio

from captioner.serving.middleware import _json

PATHS = ("/v1/explain",)
Handler = Callable[[bytes, dict[str, str]], tuple[int, dict]]  # (body, query) -> (status, JSON answer)


class RestApi:
    """ASGI middleware: ``POST /v1/explain`` answered by ``explain(body, query)`` in a worker thread; every other
    request goes on to the app behind."""

    def __init__(self, app, explain: Handler):
        self.app, self.explain = app, explain

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path", "").rstrip("/") not in PATHS:
            return await self.app(scope, receive, send)
        if scope.get("method") != "POST":
            return await _json(send, 405, {"error": "POST the image as the request body."})
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left (or the body went over the size limit: the 413 was sent)
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        try:
            status, answer = await anyio.to_thread.run_sync(self.explain, b"".join(chunks), query)
        except Exception:  # noqa: BLE001 - a bug, not the user's input: logged by the caller's handler, 500 here
            import traceback

            traceback.print_exc()
            status, answer = 500, {"error": "the server failed to caption this image."}
        await _json(send, status, answer)
