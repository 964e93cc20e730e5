"""One app request, stage by stage: where the time of /caption, /explain and the page's Caption button goes.

    python -m bench.app_profile [--calls 20] [--beam 3] [--checkpoint checkpoints/shapes-soft] [--image ...]

In-process, on one 224-px test scene: decoding the upload, preprocessing, the model (encoder, then beam search),
the explorer's teacher-forced pass, the per-word overlays the server renders (and their encoding), serialisation
(JSON), the files written, and the page's own parts (the attention view's numbers, the chart); then the same requests through the real server on a local port (``app.py`` in a
process of its own): the documented API (``POST /gradio_api/call/<api>`` and its event stream, with httpx) and
gradio_client, which also fetches every file an answer names. "transport and framework" is the round trip less the
in-process stages. Each figure is the median over ``--calls`` calls after ``--warmup``; the load average is printed
(on a shared machine figures move with it). Writes bench/results/app_profile.json.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (DEFAULT_CHECKPOINT, ROOT, add_request_arguments, environment, environment_line, median, table,
                          timed, write_json)


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT), help="checkpoint folder served")
    add_request_arguments(p, calls=20, per="figure")
    p.add_argument("--no-server", action="store_true", help="in-process stages only")
    return p


def ms(seconds: list[float]) -> float:
    return median(seconds) * 1000


def stage_rows(args, image: str, folder: Path) -> list[list]:
    """[request, stage, ms] for the work done inside the server, stage by stage: the stages in the app's model
    thread (where the app runs torch: a second thread running torch would slow the handlers down), then the
    handlers from this thread, as a request thread calls them."""
    from captioner.commands import app as app_impl

    rows = app_impl.BATCHER.call(model_thread_rows, args, image, folder)
    demo = app_impl.build_demo({folder.name: folder}, examples=[])
    explore = next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "run_ui")

    def run(fn, calls=args.calls):
        return ms(timed(fn, calls, args.warmup))

    rows += [["/caption", "handler in-process (all of the above it does)", run(
                 lambda: app_impl.predict(image, args.beam, folder.name))],
             ["/explain", "handler in-process", run(lambda: app_impl.explain_json(image, args.beam, folder.name))],
             ["page", "Caption button's handler in-process", run(lambda: explore(image, args.beam, folder.name))]]
    return rows


def model_thread_rows(args, image: str, folder: Path) -> list[list]:
    """The stages one by one (run in the app's model thread)."""
    import io

    import torch

    from captioner.commands import app as app_impl
    from captioner.app.attention import attention_payload
    from captioner.app.views import large_overlay, word_chart
    from captioner.serving import OverlayStore, explain, explain_batch
    from captioner.serving.explain import _teacher_forced
    from captioner.serving.inputs import load_picture
    from captioner.viz import attention_figure, word_overlays

    store = OverlayStore(Path(tempfile.mkdtemp(prefix="app-profile-")))
    model = app_impl.MODELS.get(folder)
    picture = load_picture(image)
    tensor = model.transform(picture).unsqueeze(0)  # (1, 3, H, W)
    with torch.inference_mode():
        annotations = model.encode(tensor)  # (1, L, C)
    explanation, _ = explain(model, picture, args.beam)
    result_words = model.decode(annotations, args.beam)[0].words
    overlays = word_overlays(picture, explanation.tokens, explanation.alphas)

    def jpegs():
        out = []
        for ov, _ in overlays:
            buffer = io.BytesIO()
            ov.save(buffer, format="JPEG", quality=90)
            out.append(buffer.getvalue())
        return out

    encoded = jpegs()
    data = explanation.to_json(folder.name, with_alphas=True)

    def run(fn, calls=args.calls):
        return ms(timed(fn, calls, args.warmup))

    def beam_only():
        with torch.inference_mode():
            model.decode(annotations, args.beam)

    def encoder_only():
        with torch.inference_mode():
            model.encode(tensor)

    batch = 16
    inputs, sizes = [tensor[0]] * batch, [picture.size] * batch
    rows = [["all", "decode upload (size check, open_image)", run(lambda: load_picture(image))],
            ["all", "preprocess (resize, normalise)", run(lambda: model.transform(picture))],
            ["all", "model: encoder", run(encoder_only)],
            ["all", f"model: beam search (beam {args.beam})", run(beam_only)],
            ["greedy only", "teacher-forced pass (p, beta, entropy; beam search records them)", run(
                lambda: _teacher_forced(model, annotations, [result_words]))],
            ["all", f"model, {batch} requests in one batch (explain_batch), per request", run(
                lambda: explain_batch(model, inputs, sizes, args.beam), max(3, args.calls // 4)) / batch],
            ["/caption", f"overlays: render {len(overlays)} x 224 px", run(
                lambda: word_overlays(picture, explanation.tokens, explanation.alphas))],
            ["/caption", "overlays: JPEG encoding", run(jpegs)],
            ["/caption", "file I/O: overlays written", run(
                lambda: [store.save_bytes(b + str(time.perf_counter_ns()).encode(), ".jpg") for b in encoded])],
            ["/explain", "serialisation: JSON answer", run(lambda: json.dumps(explanation.to_json(folder.name)))],
            ["page", "attention view: alpha grids + picture as JPEG data: URL (JSON)", run(
                lambda: attention_payload(picture, explanation.tokens, explanation.alphas))],
            ["page", "chart (SVG)", run(lambda: word_chart(explanation.tokens, explanation.word_probs,
                                                           explanation.betas, explanation.entropies))],
            ["downloads only", "large overlay + colour bar (PNG) written", run(
                lambda: store.save(large_overlay(picture, explanation.alphas[0], explanation.tokens[0])))],
            ["downloads only", "paper figure (PNG) written", run(
                lambda: store.save(attention_figure(picture, explanation.tokens, explanation.alphas)))],
            ["downloads only", "caption JSON with alphas written", run(
                lambda: store.save_bytes(json.dumps(data, indent=1).encode() + str(time.perf_counter_ns()).encode(),
                                         ".json"))],
            ]
    return rows


def call(http, url: str, api: str, data: list) -> None:
    """The documented API without gradio_client: POST /gradio_api/call/<api>, then read its event stream."""
    posted = http.post(f"{url}/gradio_api/call/{api}", json={"data": data})
    posted.raise_for_status()
    answer = http.get(f"{url}/gradio_api/call/{api}/{posted.json()['event_id']}")
    if "event: complete" not in answer.text:
        raise RuntimeError(f"/{api} failed: {answer.text[-300:]}")


def run_direct(http, url: str, api: str, data: list) -> None:
    """The one-request route: POST /gradio_api/run/<api>, the answer in its JSON body (no queue, no stream)."""
    answer = http.post(f"{url}/gradio_api/run/{api}", json={"data": data})
    answer.raise_for_status()
    if "data" not in answer.json():
        raise RuntimeError(f"/{api} failed: {answer.text[-300:]}")


def server_rows(args, image: str, folder: Path) -> list[list]:
    """[request, stage, ms] for round trips through the real server."""
    import httpx
    from gradio_client import Client, handle_file

    from bench.app_roundtrip import free_port, wait_for

    port = free_port()
    server = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--checkpoint", str(folder)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    payload = {"url": "data:image/jpeg;base64," + base64.b64encode(Path(image).read_bytes()).decode(),
               "meta": {"_type": "gradio.FileData"}}
    rows = []
    try:
        wait_for(url + "/", server)
        with httpx.Client(timeout=120) as http:
            for api in ("caption", "explain"):
                rows.append([f"/{api}", "round trip: HTTP API, queued (call + event stream; files not fetched)",
                             ms(timed(lambda: call(http, url, api, [payload, args.beam, folder.name]), args.calls,
                                      args.warmup))])
                rows.append([f"/{api}", "round trip: HTTP API, one request (/gradio_api/run; files not fetched)",
                             ms(timed(lambda: run_direct(http, url, api, [payload, args.beam, folder.name]),
                                      args.calls, args.warmup))])
            body = Path(image).read_bytes()
            rows.append(["/explain", "round trip: POST /v1/explain (the image as the body)", ms(timed(
                lambda: http.post(f"{url}/v1/explain", params={"beam_size": args.beam}, content=body
                                  ).raise_for_status(), args.calls, args.warmup))])
        work = Path(tempfile.mkdtemp(prefix="app-profile-client-"))
        client = Client(url + "/", verbose=False, download_files=str(work))
        rows.append(["/caption", "round trip: gradio_client (upload, overlay files fetched)", ms(timed(
            lambda: client.predict(handle_file(image), args.beam, folder.name, api_name="/caption"),
            args.calls, args.warmup))])
        rows.append(["/explain", "round trip: gradio_client (upload)", ms(timed(
            lambda: client.predict(handle_file(image), args.beam, folder.name, api_name="/explain"),
            args.calls, args.warmup))])
    finally:
        server.terminate()
        server.wait(timeout=60)
    return rows


def main(args: argparse.Namespace) -> int:
    folder = Path(args.checkpoint).resolve()
    image = str(Path(args.image).resolve())
    rows = stage_rows(args, image, folder)
    handler = {r[0]: r[2] for r in rows if r[1].startswith("handler")}
    if not args.no_server:
        for request, stage, value in server_rows(args, image, folder):
            rows.append([request, stage, value])
            if "HTTP API" in stage or "/v1/" in stage:
                rows.append([request, "  transport and framework (this round trip less the handler)",
                             value - handler[request]])
    env = environment()
    print(environment_line(env) + "\n")
    print(f"{Path(image).name}, beam {args.beam}, checkpoint {folder.name}; median over {args.calls} calls after "
          f"{args.warmup} warm-up calls\n")
    print(table(["request", "stage", "ms"], [[r[0], r[1], f"{r[2]:.1f}"] for r in rows]))
    write_json("app_profile", {"beam": args.beam, "calls": args.calls, "checkpoint": folder.name,
                               "stages_ms": [{"request": r[0], "stage": r[1], "ms": r[2]} for r in rows],
                               "environment": env})
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
