"""The app under load: N clients on loopback for D minutes, good uploads with bad ones interleaved.

    python -m bench.app_load [--clients 16] [--minutes 1] [--bad-every 10] [--checkpoint checkpoints/shapes-soft ...]

Starts ``app.py`` in a process of its own on a free local port, with every ``--checkpoint`` given (default: both
shipped ones). Each client loops until the time is up: /caption and /explain in turn, over the served checkpoints in
turn, each time the same 224-px test scene, by the ``--route`` chosen: ``queued``, Gradio's queued API (``POST
/gradio_api/call/<api>`` with the image as a data: URL, then its event stream); ``direct``, Gradio's one-request
route (``POST /gradio_api/run/<api>``); ``rest``, the app's own ``POST /v1/explain`` with the image as the body for
/explain, and /caption as ``direct``. Every ``--bad-every``-th request of a client is a bad upload instead, in turn: not an image, a
decompression bomb (a small PNG whose header says 30000x30000), and a body over the server's size limit. Prints
requests/s, p50/p95/p99 latency of the good requests, the answers by kind (a bad upload should get its one-line
error, never a good answer or a hang), and the server's RSS over time; writes bench/results/app_load.json.
"""

from __future__ import annotations

import argparse
import base64
import io
import struct
import subprocess
import tempfile
import sys
import threading
import time
import zlib
from collections import Counter
from pathlib import Path

from bench.common import DATASET, ROOT, environment, environment_line, table, write_json

CHECKPOINTS = [ROOT / "checkpoints" / "shapes-soft", ROOT / "checkpoints" / "shapes-hard"]


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", action="append", default=None,
                   help="a checkpoint folder to serve (repeat for several; default: both shipped checkpoints)")
    p.add_argument("--image", default=str(DATASET.parent / "images" / "test_00000.jpg"), help="the good upload")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients")
    p.add_argument("--minutes", type=float, default=1.0, help="how long the clients send requests")
    p.add_argument("--beam", type=int, default=3, help="beam size of every request")
    p.add_argument("--bad-every", type=int, default=10, help="every Nth request of a client is a bad upload (0: none)")
    p.add_argument("--route", choices=("queued", "direct", "rest"), default="queued",
                   help="how requests are sent (see above)")
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between RSS samples of the server")
    p.add_argument("--app", default=str(ROOT), metavar="DIR",
                   help="the repository whose app.py is served, e.g. an export of another commit for a baseline "
                        "measured beside this one (its own checkpoints/ unless --checkpoint is given)")
    return p


def data_url(payload: bytes) -> dict:
    return {"url": "data:image/png;base64," + base64.b64encode(payload).decode(), "meta": {"_type": "gradio.FileData"}}


def bomb_png(width: int = 30000, height: int = 30000) -> bytes:
    """A valid PNG header and one compressed row: a few hundred bytes that claim 900 megapixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * (width + 1))) + \
        chunk(b"IEND", b"")


def upload(payload: bytes) -> tuple[bytes, dict]:
    """The same file as a request body (the app's own route) and as a data: URL (Gradio's routes)."""
    return payload, data_url(payload)


def bad_uploads(limit_bytes: int) -> list[tuple[str, tuple[bytes, dict]]]:
    return [("not an image", upload(b"this is not an image at all")), ("bomb", upload(bomb_png())),
            ("oversize", upload(b"\0" * (limit_bytes + 1024)))]


def call(http, url: str, api: str, data: list) -> tuple[str, float]:
    """One request: (kind of answer, seconds). Kinds: "ok", "error event" (the app's one-line error), "http NNN"."""
    start = time.perf_counter()
    posted = http.post(f"{url}/gradio_api/call/{api}", json={"data": data})
    if posted.status_code != 200:
        return f"http {posted.status_code}", time.perf_counter() - start
    answer = http.get(f"{url}/gradio_api/call/{api}/{posted.json()['event_id']}")
    elapsed = time.perf_counter() - start
    if answer.status_code != 200:
        return f"http {answer.status_code}", elapsed
    if "event: complete" in answer.text:
        return "ok", elapsed
    ERRORS.append(answer.text.strip().splitlines()[-1][:200])  # "data: ..." with the app's message
    return "error event", elapsed


def call_direct(http, url: str, api: str, data: list) -> tuple[str, float]:
    """One request to Gradio's /gradio_api/run/<api>: "ok", "error answer" (the app's one-line error), "http NNN"."""
    start = time.perf_counter()
    answer = http.post(f"{url}/gradio_api/run/{api}", json={"data": data})
    return _kind(answer, "data"), time.perf_counter() - start


def call_rest(http, url: str, body: bytes, name: str, beam: int) -> tuple[str, float]:
    """One POST /v1/explain with the image as the body: "ok", "error answer" (400 and one sentence), "http NNN"."""
    start = time.perf_counter()
    answer = http.post(f"{url}/v1/explain", params={"beam_size": beam, "checkpoint": name}, content=body)
    return _kind(answer, "text"), time.perf_counter() - start


def _kind(answer, good_field: str) -> str:
    try:
        payload = answer.json()
    except ValueError:
        payload = {}
    if answer.status_code == 200 and good_field in payload:
        return "ok"
    if isinstance(payload, dict) and isinstance(payload.get("error"), str) and answer.status_code in (400, 500):
        ERRORS.append(payload["error"][:200])
        return "error answer"
    return f"http {answer.status_code}"


def send(http, url: str, route: str, api: str, upload: tuple[bytes, dict], name: str, beam: int):
    """One request by ``route``; ``upload``: (the file's bytes, the same as a Gradio FileData data: URL)."""
    if route == "rest" and api == "explain":
        return call_rest(http, url, upload[0], name, beam)
    return (call if route == "queued" else call_direct)(http, url, api, [upload[1], beam, name])


ERRORS: list[str] = []  # the message of every error event, in order


def client(url: str, names: list[str], good: dict, bad: list, args, stop: float, out: list, seed: int) -> None:
    import httpx

    with httpx.Client(timeout=120) as http:
        n = seed
        while time.monotonic() < stop:
            n += 1
            api = ("caption", "explain")[n % 2]
            name = names[(n // 2) % len(names)]
            if args.bad_every and n % args.bad_every == 0:
                what, upload = bad[(n // args.bad_every) % len(bad)]
            else:
                what, upload = "good", good
            try:
                kind, seconds = send(http, url, args.route, api, upload, name, args.beam)
            except httpx.HTTPError as e:
                kind, seconds = f"exception {type(e).__name__}", float("nan")
            out.append((what, api, kind, seconds, time.monotonic()))


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main(args: argparse.Namespace) -> int:
    import httpx

    from bench.app_roundtrip import free_port
    from captioner.commands.app import MAX_BODY_BYTES

    app_root = Path(args.app).resolve()
    folders = [Path(c).resolve() for c in args.checkpoint] if args.checkpoint else \
        [app_root / f.relative_to(ROOT) for f in CHECKPOINTS]
    port = free_port()
    argv = [sys.executable, "app.py", "--port", str(port), *[x for f in folders for x in ("--checkpoint", str(f))]]
    log = tempfile.TemporaryFile("w+")  # the server's stderr (a pipe nobody reads would fill and stall it)
    server = subprocess.Popen(argv, cwd=app_root, stdout=subprocess.DEVNULL, stderr=log, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and server.poll() is None:
            try:
                health = httpx.get(url + "/healthz", timeout=2).json()
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            log.seek(0)
            print(f"error: the app did not start: {log.read()[-1000:] if server.poll() else 'timeout'}",
                  file=sys.stderr)
            return 1
        names = list(health["models"])
        good = upload(Path(args.image).read_bytes())
        bad = bad_uploads(MAX_BODY_BYTES)
        results: list[tuple] = []
        start = time.monotonic()
        stop = start + args.minutes * 60
        threads = [threading.Thread(target=client, args=(url, names, good, bad, args, stop, results, i))
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        rss = [(0.0, rss_mb(server.pid))]
        while any(t.is_alive() for t in threads):
            time.sleep(min(args.sample_s, max(0.1, stop - time.monotonic() + 1)))
            rss.append((time.monotonic() - start, rss_mb(server.pid)))
        for t in threads:
            t.join()
        elapsed = time.monotonic() - start
        queue = httpx.get(url + "/healthz", timeout=10).json().get("queue")  # the model's batcher, if the app has one
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    good_ok = [r for r in results if r[0] == "good" and r[2] == "ok"]
    rows = []
    for api in ("caption", "explain", "both"):
        times = [r[3] for r in good_ok if api == "both" or r[1] == api]
        rows.append([api, len(times), f"{len(times) / elapsed:.2f}", *(f"{percentile(times, q) * 1000:.0f}"
                                                                       for q in (0.5, 0.95, 0.99))])
    kinds = Counter((r[0], r[2]) for r in results)
    print(environment_line(environment()))
    print(f"\n{args.clients} clients for {elapsed / 60:.1f} min, route {args.route}, beam {args.beam}, "
          f"checkpoints {', '.join(names)}: "
          f"{len(results)} requests, {len(results) / elapsed:.2f} requests/s\n")
    print(table(["endpoint", "good answers", "per s", "p50 ms", "p95 ms", "p99 ms"], rows))
    print("\n" + table(["upload", "answer", "count"], [[w, k, n] for (w, k), n in sorted(kinds.items())]))
    if queue:
        print(f"\nthe model's queue: {queue.get('batches')} batches, {queue.get('mean_batch')} requests per batch "
              "on average")
    print("\n" + table(["minute", "server RSS MB"], [[f"{t / 60:.1f}", f"{m:.0f}"] for t, m in rss]))
    write_json("app_load", {"clients": args.clients, "minutes": elapsed / 60, "beam": args.beam, "route": args.route,
                            "requests": len(results), "requests_per_s": len(results) / elapsed,
                            "latency_ms": {r[0]: {"p50": r[3], "p95": r[4], "p99": r[5]} for r in rows},
                            "answers": {f"{w}: {k}": n for (w, k), n in kinds.items()},
                            "rss_mb": rss, "queue": queue, "app": str(app_root), "environment": environment()})
    messages = Counter(ERRORS)
    print("\n" + table(["error message (as the client got it)", "count"],
                       [[m.removeprefix("data: ")[:110], n] for m, n in messages.most_common(8)]))
    wrong = [k for (w, k), n in kinds.items() if (w == "good") != (k == "ok")]
    if wrong:
        log.seek(0)
        print("\nthe end of the server's log:\n" + log.read()[-3000:], file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
