"""The app's round trip: where the time of one /caption call goes, from the model alone to gradio_client's answer.

    python -m bench.app_roundtrip [--calls 30] [--beam 3] [--threads N] [--checkpoint checkpoints/shapes-soft]
    python -m bench.app_roundtrip --profile     # also print the top of a cProfile of the server-side /caption work

One 224-px test scene of datasets/shapes goes through: the model alone (preprocess, encode, beam search), the
server-side handlers called in-process (``predict`` for /caption, ``explain_json`` for /explain), and then the real
server, in a process of its own on a local port, through gradio_client: a trivial endpoint on the same server that takes the same image input
and returns an empty string (Gradio's fixed cost: upload, queue, event stream), /caption (which also fetches every
overlay file it names, as the page does) and /explain. Each row is p50/p90 over ``--calls`` calls after
``--warmup`` calls. The CPU load average is printed: on a shared machine figures move with it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (DEFAULT_CHECKPOINT, ROOT, add_request_arguments, environment, environment_line, median, p90,
                          set_threads, table, timed)


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT), help="checkpoint folder served")
    add_request_arguments(p, calls=30, per="row")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)  # the server process's port
    p.add_argument("--profile", action="store_true", help="print a cProfile of the in-process /caption handler")
    return p


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, server: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Until the server at ``url`` answers (or its process has ended)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(url + "gradio_api/info", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the app server did not start at {url} (exit code {server.poll()}).")


def serve(args: argparse.Namespace) -> int:
    """The app with one more endpoint, /noop (the same image input, an empty function), on port ``args.serve``."""
    import gradio as gr

    from captioner.commands import app as app_impl
    from captioner.serving import OverlayStore

    folder = Path(args.checkpoint).resolve()
    app_impl.STORE = OverlayStore(Path(tempfile.mkdtemp(prefix="app-roundtrip-", dir=app_impl.GRADIO_CACHE)))
    demo = app_impl.build_demo({folder.name: folder}, examples=[])
    with demo:  # Gradio's fixed cost: the same image input and queue, an empty function
        noop_image = app_impl._image_input()
        noop_out = gr.Textbox(visible=False)
        gr.Button(visible=False).click(lambda picture: "", [noop_image], [noop_out], api_name="noop")
    app_impl.launch(demo, port=args.serve)
    return 0


def main(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    if args.serve:
        return serve(args)
    from gradio_client import Client, handle_file

    from captioner.commands import app as app_impl
    from captioner.serving import OverlayStore
    from captioner.serving.inputs import load_picture

    folder = Path(args.checkpoint).resolve()
    name = folder.name
    image = str(Path(args.image).resolve())
    work = Path(tempfile.mkdtemp(prefix="app-roundtrip-"))
    app_impl.STORE = OverlayStore(work / "overlays")
    model = app_impl.MODELS.get(folder)
    picture = load_picture(image)
    rows: list[list] = []

    def row(label: str, seconds: list[float]) -> None:
        rows.append([label, f"{median(seconds) * 1000:.0f}", f"{p90(seconds) * 1000:.0f}"])
        print(f"  {label}: p50 {median(seconds) * 1000:.0f} ms", file=sys.stderr, flush=True)

    row(f"model alone (preprocess, encode, beam {args.beam})",
        timed(lambda: model.caption(picture, beam_size=args.beam), args.calls, args.warmup))
    app_impl.build_demo({name: folder}, examples=[])
    row("/caption handler in-process (predict)",
        timed(lambda: app_impl.predict(image, args.beam, name), args.calls, args.warmup))
    row("/explain handler in-process (explain_json)",
        timed(lambda: app_impl.explain_json(image, args.beam, name), args.calls, args.warmup))
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [app_impl.predict(image, args.beam, name) for _ in range(10)])
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
        print(text.getvalue(), file=sys.stderr)

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.app_roundtrip", "--serve", str(port),
                               "--checkpoint", str(folder)] + (["--threads", str(args.threads)] if args.threads else []),
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for(url, server)
        client = Client(url, verbose=False, download_files=str(work / "client"))
        row("Gradio fixed cost (empty endpoint, same image upload)",
            timed(lambda: client.predict(handle_file(image), api_name="/noop"), args.calls, args.warmup))
        row(f"/caption through gradio_client (beam {args.beam}, overlays fetched)",
            timed(lambda: client.predict(handle_file(image), args.beam, name, api_name="/caption"),
                  args.calls, args.warmup))
        # gradio_client fetches each file with a new HTTP client, whose TLS set-up (certificates loaded even for
        # plain http) costs ~20 ms per file; the server answers each file in ~2 ms. Without certificates:
        local = Client(url, verbose=False, download_files=str(work / "client"), ssl_verify=False)
        row("/caption, gradio_client with ssl_verify=False (overlays fetched)",
            timed(lambda: local.predict(handle_file(image), args.beam, name, api_name="/caption"),
                  args.calls, args.warmup))
        bare = Client(url, verbose=False, download_files=False)
        row("/caption, overlays not fetched (download_files=False)",
            timed(lambda: bare.predict(handle_file(image), args.beam, name, api_name="/caption"),
                  args.calls, args.warmup))
        row(f"/explain through gradio_client (beam {args.beam})",
            timed(lambda: client.predict(handle_file(image), args.beam, name, api_name="/explain"),
                  args.calls, args.warmup))
    finally:
        server.terminate()
        server.wait(timeout=30)
    env = environment()
    print(environment_line(env) + "\n")
    print(f"{picture.width}x{picture.height} image, beam {args.beam}, checkpoint {name}; "
          f"p50/p90 over {args.calls} calls after {args.warmup} warm-up calls\n")
    print(table(["step", "p50 ms", "p90 ms"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
