"""The app on PyTorch and on ONNX Runtime, side by side: start-up time and one client's /explain latency.

    python -m bench.app_runtimes [--calls 30] [--checkpoint checkpoints/shapes-soft] [--exported DIR]
                                 [--onnx-python /path/to/light-venv/bin/python]

Two servers run at once: ``app.py --checkpoint CHECKPOINT`` (PyTorch, this Python) and ``app.py --runtime onnx
--checkpoint EXPORTED`` (``--onnx-python``: e.g. a venv made with ``pip install ".[onnx,app]"``, which has no torch;
default this Python). Start-up is the time from the process' start until ``/gradio_api/info`` answers (imports,
loading the model, its smoke test, the server). Then one client sends the same test scene to ``POST
/gradio_api/run/explain`` (one round trip: the JSON answer), alternating between the two servers call by call so
that both meet the same load; each figure is the median (and 90th percentile) over ``--calls`` calls after
``--warmup``. With ``--alone`` each server runs by itself instead (PyTorch's, stopped, then ONNX Runtime's): an idle
server's threads may still spin on the cores for a moment after each answer, which the other then pays for. The
export (when ``--exported`` is not given) is written to a temporary folder first.
"""

from __future__ import annotations

import argparse
import base64
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (DEFAULT_CHECKPOINT, ROOT, add_request_arguments, environment, environment_line, median, p90,
                          table, write_json)


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT), help="checkpoint folder served by PyTorch")
    p.add_argument("--exported", default=None, help="its export, served by ONNX Runtime (default: exported now)")
    p.add_argument("--onnx-python", default=sys.executable, help="the Python that runs the ONNX Runtime app")
    add_request_arguments(p, calls=30, per="server")
    p.add_argument("--alone", action="store_true", help="one server at a time instead of both, alternating")
    return p


def start(python: str, flags: list[str]) -> tuple[subprocess.Popen, str, float]:
    """(process, URL, seconds until it answered) of ``python app.py FLAGS`` on a free port."""
    import httpx

    from bench.app_roundtrip import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    server = subprocess.Popen([python, "app.py", "--port", str(port), *flags], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while server.poll() is None and time.perf_counter() - t0 < 300:
        try:
            if httpx.get(url + "/gradio_api/info", timeout=2).status_code == 200:
                return server, url, time.perf_counter() - t0
        except httpx.HTTPError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError(f"{python} app.py {' '.join(flags)} did not start (exit code {server.poll()}).")


def main(args: argparse.Namespace) -> int:
    import httpx

    checkpoint = Path(args.checkpoint).resolve()
    exported = Path(args.exported).resolve() if args.exported else None
    if exported is None:
        from captioner.commands.export import cli as export

        exported = Path(tempfile.mkdtemp(prefix="app-runtimes-")) / checkpoint.name
        if export(["onnx", str(checkpoint), str(exported)]) != 0:
            return 1
    payload = {"url": "data:image/jpeg;base64," + base64.b64encode(Path(args.image).read_bytes()).decode(),
               "meta": {"_type": "gradio.FileData"}}
    commands = {"torch": (sys.executable, ["--runtime", "torch", "--checkpoint", str(checkpoint)]),
                "onnx": (args.onnx_python, ["--runtime", "onnx", "--checkpoint", str(exported)])}
    times: dict[str, list[float]] = {name: [] for name in commands}
    started: dict[str, float] = {}
    for group in ([["torch"], ["onnx"]] if args.alone else [["torch", "onnx"]]):
        servers = {}
        try:
            for name in group:
                servers[name] = start(*commands[name])
                started[name] = servers[name][2]
            with httpx.Client(timeout=120) as http:
                for i in range(args.warmup + args.calls):
                    for name, (_, url, _) in servers.items():  # alternating: both meet the same load
                        body = {"data": [payload, args.beam, (checkpoint if name == "torch" else exported).name]}
                        t0 = time.perf_counter()
                        answer = http.post(f"{url}/gradio_api/run/explain", json=body)
                        elapsed = time.perf_counter() - t0
                        answer.raise_for_status()
                        if "error" in answer.json():
                            raise RuntimeError(f"/explain on {name}: {answer.json()['error']}")
                        if i >= args.warmup:
                            times[name].append(elapsed)
        finally:
            for server, _, _ in servers.values():
                server.terminate()
                server.wait(timeout=60)
    rows = [[name, f"{started[name]:.1f}", f"{median(t) * 1000:.1f}", f"{p90(t) * 1000:.1f}"]
            for name, t in times.items()]
    ratio = median(times["onnx"]) / median(times["torch"])
    env = environment()
    print(environment_line(env) + "\n")
    print(f"{Path(args.image).name}, beam {args.beam}, {checkpoint.name}; ONNX Runtime app run by {args.onnx_python}; "
          f"one client, {args.calls} calls per server after {args.warmup}, "
          f"{'one server at a time' if args.alone else 'both servers up, alternating'}\n")
    print(table(["runtime", "start-up s", "/explain p50 ms", "/explain p90 ms"], rows))
    print(f"\nONNX Runtime p50 / PyTorch p50: {ratio:.2f}")
    write_json("app_runtimes", {"rows": rows, "ratio": ratio, "onnx_python": args.onnx_python, "alone": args.alone,
                                "env": env})
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
