"""The decoder speed protocol: our decoder against a tutorial-style reference, side by side.

    python -m bench.decoder_protocol [--quick] [--threads 2]

All implementations hold the paper's decoder (ModelConfig: additive score, attention/embed/hidden 512, dropout 0.5,
gate and deep output, vocabulary 60, 112-channel 14x14 annotations), the same random weights and random annotations.
The end token's output bias is -inf, so every image is decoded for exactly 12 steps (no early ends on either side).
Phases, each in a fresh process with ``--threads`` torch threads (default 2), decoder only:

* beam search (beam 3) over 64 images one image at a time, and (ours and onnx) in batches of 32;
* one training step on 32 captions of 14-20 tokens: forward, cross-entropy (+ doubly stochastic), backward, Adam.

Each phase runs ``--warmup`` untimed passes, then ``--passes`` timed ones; the figure is the median pass. The
reference (bench/tutorial_reference.py) is written here in the style of the well-known PyTorch tutorial; the
"ratio" column is ours / reference. Peak RSS is the process's VmHWM; page faults are minor faults per timed pass.

The "onnx" rows are the ONNX Runtime route: the same decoder weights in a ``Captioner`` (with a one-convolution
encoder that gives the 112 x 14 x 14 annotations; the beam phases never run it) exported once by
``captioner.checkpoints.onnx_export.export`` (its self-check against PyTorch included) to a temporary folder before the phases,
loaded with ``captioner.load_onnx(folder, threads=--threads)`` and searched by ``captioner.runtime.search`` on numpy
over the same annotations; export and loading are outside the timed passes. The export's check takes the -inf end
bias as it is (both routes give -inf there), so all three implementations decode the same 12 steps. Its check
column compares every image's words with our PyTorch beam search (one image at a time) on the same annotations.
Needs ``onnx`` and ``onnxruntime`` (``pip install ".[export]"``); without them the onnx rows are left out.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, environment, median, part_parser, run_part, table


IMAGES, BATCH, BEAM, STEPS, VOCAB, CHANNELS, GRID, TRAIN_CAPTIONS = 64, 32, 3, 12, 60, 112, 14, 32
START, END = 1, 2  # captioner.vocab's indices
PHASES = (("beam_single", "ours"), ("beam_single", "reference"), ("beam_single", "onnx"), ("beam_batched", "ours"),
          ("beam_batched", "onnx"), ("train", "ours"), ("train", "reference"))
ONNX_INPUTS = "protocol_inputs.npz"  # in the exported folder: the annotations and our captions of them
UNITS = {"beam_single": "images/s", "beam_batched": "images/s", "train": "captions/s"}
TITLES = {"beam_single": "beam search, one image at a time", "beam_batched": f"beam search, batches of {BATCH}",
          "train": f"one training step, {TRAIN_CAPTIONS} captions of 14-20 tokens"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocol-passes", type=int, default=5, help="timed passes per phase (median reported)")
    p.add_argument("--protocol-warmup", type=int, default=2, help="untimed passes first")
    p.add_argument("--profile", default=None, choices=sorted(UNITS),
                   help="instead of the table: torch.profiler's top operators (self CPU) of one pass of this phase")
    p.add_argument("--phase", default=None, help=argparse.SUPPRESS)  # worker mode: one phase in this process
    p.add_argument("--impl", default=None, help=argparse.SUPPRESS)
    p.add_argument("--onnx-folder", default=None, help=argparse.SUPPRESS)  # worker mode: the exported decoder


def quick(args: argparse.Namespace) -> None:
    args.protocol_passes, args.protocol_warmup = 2, 1


def paper_decoder():
    """The paper's decoder with random weights; the end token can never be chosen (exactly ``STEPS`` steps)."""
    import torch

    from captioner import ModelConfig
    from captioner.model.decoder import Decoder

    torch.manual_seed(0)
    cfg = ModelConfig(encoder_channels=CHANNELS, grid=GRID, attention="soft", score="additive", embed_dim=512,
                      hidden_dim=512, attention_dim=512, dropout=0.5, gate=True, deep_output=True, positional=0,
                      location=False, word_query=False, vocab_size=VOCAB)
    decoder = Decoder(cfg)
    with torch.no_grad():
        decoder.L_o.bias[END] = float("-inf")
    return decoder


def training_batch(generator):
    """(annotations (B, L, C), captions (B, 21), lengths (B,)): 14-20 tokens each, <start> and <end> included."""
    import torch

    lengths = torch.randint(14, 21, (TRAIN_CAPTIONS,), generator=generator)  # (B,)
    captions = torch.randint(4, VOCAB, (TRAIN_CAPTIONS, 21), generator=generator)  # (B, T+1)
    captions[:, 0] = START
    for i, n in enumerate(lengths.tolist()):
        captions[i, n - 1] = END
        captions[i, n:] = 0
    captions = captions[:, : int(lengths.max())]  # (B, T+1): no column that is padding in every caption
    annotations = torch.randn(TRAIN_CAPTIONS, GRID * GRID, CHANNELS, generator=generator)
    return annotations, captions, lengths


def make_pass(phase: str, impl: str):
    """(one pass: () -> None, items per pass, rows per step, parameters, check: () -> str)."""
    import torch

    from captioner.decoding.search import beam_search

    decoder = paper_decoder()
    params = sum(p.numel() for p in decoder.parameters())
    generator = torch.Generator().manual_seed(1)
    if impl == "reference":
        from bench.tutorial_reference import ReferenceDecoder

        model = ReferenceDecoder.like(decoder)
        params = sum(p.numel() for p in model.parameters())
    images = torch.randn(IMAGES, GRID * GRID, CHANNELS, generator=generator)  # (N, L, C): as protocol_images()
    if phase == "train":
        annotations, captions, lengths = training_batch(generator)
        net = decoder if impl == "ours" else model
        net.train()
        optimizer = torch.optim.Adam(net.parameters(), lr=4e-4)
        if impl == "ours":
            from captioner.training.losses import caption_loss
            from captioner.training.loops import optimiser_step

            try:
                from captioner.allocator import keep_freed_memory
            except ImportError:  # an older tree without captioner.allocator (A/B runs against it)
                def keep_freed_memory():
                    pass
            keep_freed_memory()  # what train_one_epoch does first

            def one_pass():
                out = decoder(annotations, captions, lengths)
                loss, _ = caption_loss(out, captions[:, 1:], lambda_ds=1.0)
                optimiser_step(loss, optimizer, grad_clip=5.0)
        else:
            def one_pass():
                loss = model.loss(annotations, captions, lengths, lambda_ds=1.0)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
                optimizer.step()
        rows = f"{TRAIN_CAPTIONS} shrinking to {int(lengths.min()) - 1}"
        return one_pass, TRAIN_CAPTIONS, rows, params, lambda: ""
    decoder.eval()
    results: list = []
    if impl == "reference":
        model.eval()

        def one_pass():
            results[:] = [model.beam_search(images[i:i + 1], START, END, BEAM, STEPS) for i in range(IMAGES)]
        rows = f"{BEAM}"
    else:
        size = 1 if phase == "beam_single" else BATCH

        def one_pass():
            results[:] = [(h.words, h.log_prob) for s in range(0, IMAGES, size)
                          for h in beam_search(decoder, images[s:s + size], START, END, BEAM, STEPS)]
        rows = f"{BEAM * size}"

    def check() -> str:
        lengths = {len(words) for words, _ in results}
        return f"words per caption {sorted(lengths)}"
    return one_pass, IMAGES, rows, params, check


def protocol_images():
    """The 64 annotation sets (N, L, C) every beam phase decodes (``make_pass`` draws the same ones)."""
    import torch

    return torch.randn(IMAGES, GRID * GRID, CHANNELS, generator=torch.Generator().manual_seed(1))


def onnx_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))


def export_onnx(folder: Path) -> dict:
    """``paper_decoder()`` in a Captioner, exported to ``folder`` (the export checks itself against PyTorch), with
    the annotations and our PyTorch beam search's words for each image (one at a time) in ``ONNX_INPUTS``;
    returns the export's largest differences."""
    import dataclasses

    import numpy as np
    import torch
    from torch import nn

    from captioner.decoding.search import beam_search
    from captioner.decoding.config import DecodingConfig
    from captioner.encoders import Preprocessing
    from captioner.encoders.base import Encoder
    from captioner.model.captioner import Captioner
    from captioner.checkpoints.onnx_export import export
    from captioner.vocab import Vocabulary

    decoder = paper_decoder().eval()
    vocab = Vocabulary([f"w{i}" for i in range(VOCAB - 4)])  # the four special tokens first: VOCAB words
    cfg = dataclasses.replace(decoder.cfg, encoder="small_cnn", encoder_weights=None)
    model = Captioner(cfg, vocab, Preprocessing(4 * GRID, (0.5,) * 3, (0.5,) * 3), encoder_weights=None,
                      decoding=DecodingConfig(beam_size=BEAM, max_len=STEPS))
    model.encoder = Encoder([nn.Conv2d(3, CHANNELS, 4, stride=4)], CHANNELS)  # (B, 3, 56, 56) -> (B, 196, 112)
    model.cfg, model.decoder = dataclasses.replace(model.cfg, encoder_channels=CHANNELS), decoder
    report = export(model.eval(), folder, source="bench.decoder_protocol: paper_decoder()")
    images = protocol_images()  # (N, L, C)
    with torch.no_grad():
        hyps = [beam_search(decoder, images[i:i + 1], START, END, BEAM, STEPS)[0] for i in range(IMAGES)]
    np.savez(folder / ONNX_INPUTS, images=images.numpy(), words=np.array([h.words for h in hyps], dtype=np.int64),
             log_probs=np.array([h.log_prob for h in hyps], dtype=np.float64))
    return report


def make_onnx_pass(phase: str, folder: str, threads: int):
    """``make_pass`` for the ONNX Runtime route: ``captioner.runtime.search`` over the exported decoder."""
    import numpy as np

    from captioner.runtime import load_onnx
    from captioner.runtime.search import beam_search

    model = load_onnx(folder, threads=threads)
    saved = np.load(Path(folder) / ONNX_INPUTS)
    images, expected, expected_lp = saved["images"], saved["words"], saved["log_probs"]  # (N, L, C), (N, T), (N,)
    params = onnx_weights(Path(folder))
    size = 1 if phase == "beam_single" else BATCH
    results: list = []

    def one_pass():
        results[:] = [(h.words, h.log_prob) for s in range(0, IMAGES, size)
                      for h in beam_search(model, images[s:s + size], START, END, BEAM, STEPS)]

    def check() -> str:
        same = sum(words == e.tolist() for (words, _), e in zip(results, expected))
        lp = max(abs(p - e) for (_, p), e in zip(results, expected_lp))
        lengths = sorted({len(words) for words, _ in results})
        return (f"words per caption {lengths}, same words as ours (PyTorch, one image at a time) for {same}/{IMAGES} "
                f"images, log-prob max abs diff {lp:.1e}")
    return one_pass, IMAGES, f"{BEAM * size}", params, check


def onnx_weights(folder: Path) -> int:
    """Numbers stored in the decoder's two graphs (after constant folding: may differ from the module's count)."""
    import math

    import onnx

    return sum(math.prod(t.dims) for name in ("decoder_init.onnx", "decoder_step.onnx")
               for t in onnx.load(str(folder / name)).graph.initializer)


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker(phase: str, impl: str, passes: int, warmup: int, threads: int = 2, onnx_folder: str | None = None) -> dict:
    """Time one phase in this process (``onnx_folder``: the exported decoder, for impl "onnx")."""
    import torch

    if impl == "onnx":
        one_pass, items, rows, params, check = make_onnx_pass(phase, onnx_folder, threads)
    else:
        one_pass, items, rows, params, check = make_pass(phase, impl)
    for _ in range(warmup):
        one_pass()
    times, cpu, faults = [], [], []
    for _ in range(passes):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        one_pass()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        times.append(time.perf_counter() - t0)
        cpu.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
        faults.append(r1.ru_minflt - r0.ru_minflt)
    return {"phase": phase, "impl": impl, "items": items, "rows_per_step": rows, "parameters": params,
            "pass_s": times, "pass_s_median": median(times), "rate": items / median(times),
            "cpu_s": cpu, "cpu_s_median": median(cpu), "rate_per_cpu_s": items / median(cpu),
            "minor_faults_per_pass": median(faults), "peak_rss_mib": peak_rss_mib(), "check": check(),
            "threads": threads if impl == "onnx" else torch.get_num_threads(),
            "load_average_1min": round(os.getloadavg()[0], 2)}


def run(args: argparse.Namespace) -> dict:
    threads = args.threads or 2
    rows, export_report, export_s = [], None, None
    with tempfile.TemporaryDirectory(prefix="decoder-protocol-onnx-") as tmp:
        folder = Path(tmp) / "model"
        if onnx_available():  # once, before the phases: not part of any timed pass
            t0 = time.perf_counter()
            export_report = export_onnx(folder)
            export_s = time.perf_counter() - t0
        for phase, impl in PHASES:
            if impl == "onnx" and export_report is None:
                continue
            cmd = [sys.executable, "-m", "bench.decoder_protocol", "--phase", phase, "--impl", impl, "--threads",
                   str(threads), "--protocol-passes", str(args.protocol_passes), "--protocol-warmup",
                   str(args.protocol_warmup), "--onnx-folder", str(folder)]
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
            if done.returncode:
                raise RuntimeError(f"{phase}/{impl} failed:\n{done.stderr[-3000:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {"environment": environment(), "threads": threads, "rows": rows, "onnx_export_s": export_s,
            "onnx_export_max_diff": max(export_report.values()) if export_report else None}


def markdown(result: dict) -> str:
    rows = result["rows"]
    reference = {r["phase"]: r for r in rows if r["impl"] == "reference"}
    single_reference = reference.get("beam_single")
    lines = []
    for r in rows:
        if r["impl"] == "reference":
            continue
        ref = reference.get(r["phase"]) or single_reference  # batched: against the reference's one-image figure
        ratio = f"{r['rate'] / ref['rate']:.2f}x" if ref else "-"
        spread = f"{min(r['pass_s']):.3f}-{max(r['pass_s']):.3f}"
        ref_spread = f"{min(ref['pass_s']):.3f}-{max(ref['pass_s']):.3f}" if ref else "-"
        lines.append([TITLES[r["phase"]], r["impl"], f"{ref['rate']:.1f} {UNITS[r['phase']]}" if ref else "-",
                      f"{r['rate']:.1f} {UNITS[r['phase']]}", ratio,
                      f"{r['rate_per_cpu_s']:.1f} / {ref['rate_per_cpu_s']:.1f}" if ref else "-", r["rows_per_step"],
                      f"{spread} / {ref_spread}",
                      f"{r['peak_rss_mib']:.0f} / {ref['peak_rss_mib']:.0f}" if ref else "-",
                      f"{r['minor_faults_per_pass']:.0f} / {ref['minor_faults_per_pass']:.0f}" if ref else "-",
                      f"{r['load_average_1min']} / {ref['load_average_1min']}" if ref else "-"])
    params = {r["impl"]: r["parameters"] for r in rows}
    onnx_params = f", onnx graphs {params['onnx']:,}" if "onnx" in params else ""
    head = (f"#### Decoder protocol: {IMAGES} images, beam {BEAM}, exactly {STEPS} steps, "
            f"{result['threads']} threads, decoder only; parameters ours {params.get('ours', 0):,}, reference "
            f"{params.get('reference', 0):,}{onnx_params}\n\n")
    exported = ""
    if result.get("onnx_export_s") is not None:
        exported = (f"onnx: ONNX Runtime over the exported decoder (export and self-check "
                    f"{result['onnx_export_s']:.0f} s before the phases, largest difference from PyTorch "
                    f"{result['onnx_export_max_diff']:.1e}); ")
    note = ("\n\nratio = ours or onnx / reference (batched rows: against the reference's one-image figure); "
            + exported + "per CPU-second: "
            "items per second of process CPU time (user + system), steadier than wall time on a shared machine; "
            "pass seconds are "
            "min-max of the timed passes; peak RSS is VmHWM of each phase's process; load is the 1-minute load "
            "average when the phase ended. " + "; ".join(f"{r['phase']}/{r['impl']}: {r['check']}" for r in rows
                                                        if r["check"]))
    return head + table(["phase", "impl", "reference", "this impl", "ratio", "per CPU-second impl / ref",
                         "rows per step", "pass s impl / ref", "peak RSS MiB impl / ref",
                         "minor faults per pass impl / ref", "load impl / ref"],
                        lines) + note


def profile(phase: str, threads: int, rows: int = 15) -> str:
    """torch.profiler's operators by self CPU time over one pass (after one warm-up pass) of our ``phase``."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.set_num_threads(threads)
    one_pass, *_ = make_pass(phase, "ours")
    one_pass()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        one_pass()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    lines = [[e.key, f"{100 * e.self_cpu_time_total / total:.1f}%", f"{e.self_cpu_time_total / 1e3:.1f}", e.count]
             for e in events[:rows]]
    return (f"profile of {phase}, {threads} thread(s), 1-min load {os.getloadavg()[0]:.2f}, self CPU total "
            f"{total / 1e6:.2f} s\n\n" + table(["operator", "self CPU", "ms", "calls"], lines))


def main(args: argparse.Namespace) -> int:
    if args.profile:
        print(profile(args.profile, args.threads or 2))
        return 0
    if args.phase:  # worker: one phase, one JSON line
        import torch

        torch.set_num_threads(args.threads or 2)
        print(json.dumps(worker(args.phase, args.impl, args.protocol_passes, args.protocol_warmup, args.threads or 2,
                                args.onnx_folder)))
        return 0
    return run_part("decoder_protocol", args, run, markdown, quick)


if __name__ == "__main__":
    sys.exit(main(part_parser(__doc__, add_arguments, "smoke-run sizes").parse_args()))
