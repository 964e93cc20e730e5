"""Files handed out under opaque names: ``files/<id>/<name>`` instead of the server path Gradio puts in every file
it serves (``/gradio_api/file=/tmp/gradio/<hash>/x.jpg``, in the page config, the answers and the upload replies).

Gradio keeps working with its real paths inside the server; ``OpaqueFiles`` translates at the HTTP boundary:
- answers (JSON, the event streams, the page's embedded config): a path of a file under the registry's folders
  becomes ``files/<id>/<name>`` (``<id>`` random, from ``FileRegistry``); a URL ``.../gradio_api/file=<path>``
  becomes ``.../files/<id>/<name>``; any other mention of those folders is cut to the file's name;
- requests: a JSON body that names ``files/<id>/<name>`` (an upload or an example sent back as input) gets the real
  path back before Gradio reads it;
- ``GET /files/<id>/<name>`` and ``GET /gradio_api/file=files/<id>/<name>`` (what gradio_client asks for) are
  served by Gradio's own file route (its folder checks and content types) for a registered id; anything else,
  ``/gradio_api/file=<server path or URL>`` included, is 404.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
from collections import OrderedDict
from pathlib import Path
from urllib.parse import quote, unquote

ID_CHARS = 16  # secrets.token_urlsafe(12): 96 random bits
TOKEN_RE = re.compile(r"files/(?P<id>[A-Za-z0-9_-]{16})/(?P<name>[^/]+)")
# what a browser (url) or gradio_client (root + "file=" + path) asks for
FETCH_RE = re.compile(r"(?P<prefix>[^=]*?)/(?:gradio_api/file=)?files/(?P<id>[A-Za-z0-9_-]{16})/(?P<name>[^/]+)")
FILE_URL_RE = re.compile(r"gradio_api/file=(?P<path>/[^\s\"'<>?#]*)")
HTML_MARKERS = (b"window.gradio_config = ", b"window.gradio_api_info = ")


class FileRegistry:
    """Random ids for the files under ``folders`` that the app hands out; bounded (the oldest ids are forgotten)."""

    def __init__(self, folders: list[str | Path], private: list[str | Path] = (), max_entries: int = 50_000):
        """``folders``: where the files handed out live; ``private``: more folders whose mention in a message is
        cut to the file's name (the working directory, the home and temporary folders, the repository)."""
        self.folders = _spellings(folders)
        self.max_entries = max_entries
        self._paths: OrderedDict[str, str] = OrderedDict()  # id -> real path
        self._ids: dict[str, str] = {}  # real path -> id
        self._lock = threading.Lock()
        mentioned = sorted(set(self.folders) | set(_spellings(private)), key=len, reverse=True)
        self._mention = re.compile("|".join(re.escape(f) + r"(?:/[^\s\"'<>?#,;)]*|(?![\w.-]))" for f in mentioned))

    def _servable(self, path: str) -> bool:
        if len(path) > 4096 or "\x00" in path or "\n" in path:
            return False
        try:
            candidate = Path(path)
            if not candidate.is_absolute() or not candidate.is_file():
                return False
            real = str(candidate.resolve())
        except (OSError, ValueError):  # a name too long for the file system, say: not a file handed out
            return False
        return any(real == f or real.startswith(f + os.sep) for f in self.folders)

    def token(self, path: str) -> str | None:
        """``files/<id>/<name>`` for a file under the registry's folders (the same id each time); else None."""
        with self._lock:
            fid = self._ids.get(path)
            if fid is not None:
                self._paths.move_to_end(fid)
        if fid is None:
            if not self._servable(path):
                return None
            with self._lock:
                fid = self._ids.get(path) or secrets.token_urlsafe(12)
                self._ids[path] = fid
                self._paths[fid] = path
                while len(self._paths) > self.max_entries:
                    old_id, old_path = self._paths.popitem(last=False)
                    self._ids.pop(old_path, None)
        return f"files/{fid}/{Path(path).name}"

    def lookup(self, fid: str, name: str) -> str | None:
        """The real path behind ``files/<fid>/<name>`` while the file exists; None for anything else."""
        with self._lock:
            path = self._paths.get(fid)
        if path is None or Path(path).name != name or not os.path.isfile(path):
            return None
        return path

    # ---- JSON values --------------------------------------------------------------------------------------------

    def hide(self, value):
        """``value`` (parsed JSON) with every server path under the folders replaced (see the module docstring)."""
        if isinstance(value, dict):
            return {key: self.hide(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.hide(item) for item in value]
        if isinstance(value, str) and "/" in value:
            return self.hide_text(value)
        return value

    def hide_text(self, text: str) -> str:
        if text.startswith("data:"):  # an inline image (the chart): base64 may contain "/tmp" by chance
            return text
        if text.startswith("/") and (token := self.token(text)):
            return token
        text = FILE_URL_RE.sub(self._url_for, text)
        return self._mention.sub(self._name_for, text)

    def _url_for(self, match: re.Match) -> str:
        token = self.token(unquote(match["path"]))
        if token is None:
            return match[0]  # the folder mention is cut by _name_for
        fid, name = TOKEN_RE.fullmatch(token).group("id", "name")
        return f"files/{fid}/{quote(name)}"

    def _name_for(self, match: re.Match) -> str:
        return self.token(match[0]) or Path(match[0]).name or "a server folder"

    def reveal(self, value):
        """``value`` (parsed JSON from a request) with each registered ``files/<id>/<name>`` back to its path."""
        if isinstance(value, dict):
            return {key: self.reveal(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.reveal(item) for item in value]
        if isinstance(value, str) and (match := TOKEN_RE.fullmatch(value)):
            return self.lookup(match["id"], match["name"]) or value
        return value

    # ---- bodies ---------------------------------------------------------------------------------------------------

    def hide_json_bytes(self, body: bytes) -> bytes:
        try:
            value = json.loads(body)
        except ValueError:
            return body
        return json.dumps(self.hide(value), ensure_ascii=False, separators=(",", ":")).encode()

    def hide_html_bytes(self, body: bytes) -> bytes:
        """The page: the config and API description Gradio embeds as JSON in a script tag."""
        for marker in HTML_MARKERS:
            start = body.find(marker)
            if start < 0:
                continue
            start += len(marker)
            text = body[start:].decode("utf-8", errors="surrogateescape")
            try:
                value, end = json.JSONDecoder().raw_decode(text)
            except ValueError:
                continue
            dumped = (json.dumps(self.hide(value), ensure_ascii=False, separators=(",", ":"))
                      .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
                      .replace("'", "\\u0027"))
            body = body[:start] + dumped.encode() + text[end:].encode("utf-8", errors="surrogateescape")
        return self._mention.sub(lambda m: self._name_for(m), body.decode("utf-8", "surrogateescape")).encode(
            "utf-8", "surrogateescape")

    def hide_sse_line(self, line: bytes) -> bytes:
        if not line.startswith(b"data:") or b"/" not in line:
            return line
        end = b"\r" if line.endswith(b"\r") else b""
        return b"data: " + self.hide_json_bytes(line[5:len(line) - len(end)].lstrip()) + end


def _spellings(folders) -> list[str]:
    """Each folder as given (absolute) and with its links resolved, longest first; never the root folder."""
    names = {str(Path(f).absolute()) for f in folders} | {str(Path(f).resolve()) for f in folders}
    return sorted((n.rstrip(os.sep) for n in names if n.rstrip(os.sep)), key=len, reverse=True)


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((value for key, value in headers if key.lower() == name), None)


def _with_length(headers: list[tuple[bytes, bytes]], length: int | None) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    return kept + ([(b"content-length", str(length).encode())] if length is not None else [])


class OpaqueFiles:
    """ASGI middleware: serve ``files/<id>/<name>`` and keep server paths out of every answer (see the module)."""

    def __init__(self, app, registry: FileRegistry):
        self.app, self.registry = app, registry

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        fetch = FETCH_RE.fullmatch(scope.get("path", ""))
        if fetch and scope.get("method") in ("GET", "HEAD"):
            real = self.registry.lookup(fetch["id"], fetch["name"])
            if real is None:
                return await _not_found(send)
            path = f"{fetch['prefix']}/gradio_api/file={real}"
            scope = dict(scope, path=path, raw_path=quote(path).encode())
        elif "/file=" in scope.get("path", ""):  # Gradio's route asked for by path (or URL): never handed out
            return await _not_found(send)
        elif scope.get("method") == "POST" and b"json" in (_header(scope.get("headers", []), b"content-type") or b""):
            scope, receive = await self._revealed(scope, receive)
        # a file (a JSON download, say) goes out as it is; only an error about one is checked for paths
        errors_only = "/file=" in scope.get("path", "")
        await self.app(scope, receive, self._hiding(send, errors_only))

    async def _revealed(self, scope, receive):
        """The request with its JSON body read and each registered token turned back into its path."""
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return scope, _replay([message], receive)
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if b"files/" in body:
            try:
                body = json.dumps(self.registry.reveal(json.loads(body))).encode()
            except ValueError:
                pass
        scope = dict(scope, headers=_with_length(list(scope.get("headers", [])), len(body)))
        return scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive)

    def _hiding(self, send, errors_only: bool = False):
        registry = self.registry
        state = {"mode": "pass", "start": None, "chunks": [], "pending": b""}

        async def hiding_send(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                kind = (_header(headers, b"content-type") or b"").lower()
                if _header(headers, b"content-encoding") or (errors_only and message.get("status", 200) < 400):
                    state["mode"] = "pass"
                elif kind.startswith((b"application/json", b"text/html")):
                    state["mode"] = "html" if kind.startswith(b"text/html") else "json"
                    state["start"] = message
                    return  # sent with the body, once its length is known
                elif kind.startswith(b"text/event-stream"):
                    state["mode"] = "sse"
                    message = dict(message, headers=_with_length(headers, None))
                else:
                    state["mode"] = "pass"
                return await send(message)
            if message["type"] != "http.response.body" or state["mode"] == "pass":
                return await send(message)
            body, more = message.get("body", b""), message.get("more_body", False)
            if state["mode"] == "sse":
                data = state["pending"] + body
                cut = data.rfind(b"\n") + 1 if more else len(data)
                state["pending"] = data[cut:]
                lines = data[:cut].split(b"\n")
                return await send(dict(message, body=b"\n".join(registry.hide_sse_line(x) for x in lines)))
            state["chunks"].append(body)
            if more:
                return None
            whole = b"".join(state["chunks"])
            whole = registry.hide_html_bytes(whole) if state["mode"] == "html" else registry.hide_json_bytes(whole)
            start = state["start"]
            await send(dict(start, headers=_with_length(list(start.get("headers", [])), len(whole))))
            await send({"type": "http.response.body", "body": whole, "more_body": False})

        return hiding_send


def _replay(messages: list[dict], receive):
    queue = list(messages)

    async def replayed():
        return queue.pop(0) if queue else await receive()

    return replayed


async def _not_found(send) -> None:
    body = b'{"detail": "Not Found"}'
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
