"""Captioning speed: images/s and latency per batch size and beam width, split into image decoding, encoder, decoder.

    python -m bench.speed [--quick] [--threads N] [--checkpoint checkpoints/shapes-soft]

For each batch size (1 = one image at a time) and beam width, the same N test scenes of datasets/shapes are captioned
``--repeats`` times after one warm-up pass. Each batch is timed in three stages: image decoding (file -> PIL -> the
encoder's preprocessed tensor), encoder (annotations), decoder (greedy for beam 1, else batched beam search, plus
turning hypotheses into results). Stage times are medians over the repeats; latency is per batch over all batches.

Then, end to end (``--e2e-images``, batch 32, beam 3): ``caption_paths`` (what caption.py runs) with 0 and 1
DataLoader workers against the encoder alone on the same images already preprocessed, and, with
``--e2e-processes N`` (default 2; 0 skips it), both split over N processes of one torch thread each, as
``torchrun --nproc_per_node=N caption.py`` runs them. The variants alternate; medians of ``--speed-repeats``.
Last, the floor (``floor``): the image reading, the LSTM cells of the rows beam search steps and the decoder's
initial state, timed alone, and the fraction of the encoder-only rate that no fp32 decoder of this model can beat.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from bench.common import (DATASET, DEFAULT_CHECKPOINT, bench_model, ensure_dataset, environment, median, p90,
                          part_parser, run_part, step_rows, table)


def get_args_parser() -> argparse.ArgumentParser:
    return part_parser(__doc__, add_arguments, "smoke-run sizes (seconds)")


def int_list(text: str) -> list[int]:
    """'1,8,32' -> [1, 8, 32]; argparse turns the ValueError into a one-line usage error."""
    values = [int(x) for x in str(text).split(",") if x.strip()]
    if not values or min(values) < 1:
        raise ValueError(text)
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT),
                   help="checkpoint folder (absent: efficientnet_lite0 + a random decoder of default size)")
    p.add_argument("--speed-images", type=int, default=32, help="test scenes captioned per repeat")
    p.add_argument("--speed-repeats", type=int, default=3, help="timed repeats after one warm-up pass")
    p.add_argument("--batch-sizes", type=int_list, default="1,8,32", help="comma-separated batch sizes")
    p.add_argument("--beams", type=int_list, default="1,3,5", help="comma-separated beam widths (1 = greedy)")
    p.add_argument("--e2e-images", type=int, default=96,
                   help="test scenes for the end-to-end comparison (batch 32, beam 3; 0: skip it)")
    p.add_argument("--e2e-processes", type=int, default=2,
                   help="also time the end-to-end comparison split over this many processes of one torch thread "
                        "each, as caption.py runs under torchrun (0 or 1: skip it)")


def quick(args: argparse.Namespace) -> None:
    """Smoke-run sizes."""
    args.speed_images, args.speed_repeats, args.batch_sizes, args.beams = 8, 1, [1, 8], [1, 3]
    args.e2e_images, args.e2e_processes = 16, 0


def _test_paths(dataset: Path, n: int) -> list[Path]:
    from captioner.data.karpathy import KarpathySplit

    return KarpathySplit.load(dataset, "test").image_paths[:n]


@torch.inference_mode()
def caption_once(model, paths: list[Path], batch_size: int, beam: int) -> tuple[list[dict], int]:
    """One pass over ``paths``: per-batch stage times (s) and the number of words produced. The stages are
    caption_paths' own: reading, encoder, decoder (with the results), the domain check."""
    from captioner.images import open_image

    resize = model.preprocessing.resize()  # as caption_paths: uint8 per image, the batch normalised at once
    batches, words = [], 0
    for i in range(0, len(paths), batch_size):
        t0 = time.perf_counter()
        images = model.preprocessing.normalize(torch.stack([resize(open_image(p)) for p in paths[i:i + batch_size]]))
        t1 = time.perf_counter()
        annotations = model.encode(images)  # (B, L, C)
        t2 = time.perf_counter()
        results = [model.to_result(h) for h in model.decode(annotations, beam)]
        t3 = time.perf_counter()
        if model.domain is not None:  # caption_paths checks every image against the training domain too
            model.domain.check(annotations)
        t4 = time.perf_counter()
        words += sum(len(r.tokens) for r in results)
        batches.append({"images": len(results), "decode_image": t1 - t0, "encoder": t2 - t1, "decoder": t3 - t2,
                        "domain": t4 - t3})
    return batches, words


def encoder_pass(model, paths: list, batch_size: int):
    """A function that encodes ``paths`` (preprocessed once, here, in batches) and returns how many it encoded."""
    from captioner.images import open_image

    transform = model.preprocessing.transform()
    batches = [torch.stack([transform(open_image(p)) for p in paths[i:i + batch_size]])
               for i in range(0, len(paths), batch_size)]  # (B, 3, H, W) each

    def encode_all() -> int:
        with torch.inference_mode():
            for images in batches:
                model.encode(images)
        return len(paths)

    return encode_all


def end_to_end(model, paths: list[Path], batch_size: int, beam: int, repeats: int, processes: int = 0,
               checkpoint: str | Path | None = None, dataset: Path = DATASET) -> dict:
    """images/s of ``caption_paths`` (what caption.py runs: decoding in 0 or 1 DataLoader worker, batches,
    records) against the encoder alone on the same images already preprocessed; the variants alternate.

    With ``processes`` > 1, two more variants: the same two jobs split over that many processes of one torch
    thread each (each its contiguous share of the images, as caption.py under torchrun), timed from the moment
    the parent tells them to start until the last one reports (their model loading and warm-up are not timed)."""
    from captioner.batch.captioning import caption_paths

    encoder_only = encoder_pass(model, paths, batch_size)
    variants = {"encoder only": encoder_only}
    for workers in (0, 1):
        variants[f"caption_paths, {workers} workers"] = (
            lambda w=workers: sum(1 for _ in caption_paths(model, paths, beam, batch_size, workers=w)))
    group = None
    try:
        if processes > 1:
            group = ProcessGroup(processes, checkpoint, dataset, paths, batch_size, beam)
            variants[f"encoder only, {processes} processes x 1 thread"] = lambda: group.run("encoder")
            variants[f"caption_paths, {processes} processes x 1 thread"] = lambda: group.run("caption")
        seconds: dict[str, list[float]] = {k: [] for k in variants}
        for fn in variants.values():
            fn()  # warm-up
        for _ in range(repeats):
            for name, fn in variants.items():
                start = time.perf_counter()
                fn()
                seconds[name].append(time.perf_counter() - start)
    finally:
        if group is not None:
            group.close()
    rate = {k: len(paths) / median(v) for k, v in seconds.items()}
    least = floor(model, paths, batch_size, beam, repeats)
    encoder_s = median(seconds["encoder only"])
    least["bound"] = encoder_s / (encoder_s + least["images"] + least["lstm"])
    least["bound_with_state"] = encoder_s / (encoder_s + least["images"] + least["state"] + least["lstm"])
    return {"batch_size": batch_size, "beam": beam, "images": len(paths), "repeats": repeats,
            "processes": processes if group is not None else 1, "floor": least,
            "images_per_s": rate, "of_encoder": {k: v / rate["encoder only"] for k, v in rate.items()}}


def floor(model, paths: list[Path], batch_size: int, beam: int, repeats: int) -> dict:
    """Work that ``caption_paths`` cannot skip beside the encoder, in seconds per pass over ``paths``: reading the
    images (open, resize, stack, normalise: what the encoder-only variant was handed ready) and the LSTM cells of
    the decoder rows beam search steps (``torch.lstm_cell`` on the rows of each step, fp32, the model's weights; every
    other decoder op taken as free). Medians of ``repeats`` passes after a warm-up. With the encoder-only time E, no
    fp32 decoder of this model can make the whole path faster than E / (E + images + lstm) of the encoder alone.

    Also timed alone: ``state``, the decoder's initial state once per image (``Decoder.init_state``: the look-alike
    channels, the attention keys, h_0 and c_0), the model's own per-image work before the first word, as this
    project computes it."""
    from torch.utils.data import DataLoader

    from captioner.batch.captioning import ImageFiles, collate

    loader = DataLoader(ImageFiles(paths, model.preprocessing.resize()), batch_size=batch_size, collate_fn=collate)

    def read_images() -> list[torch.Tensor]:
        return [model.preprocessing.normalize(images) for _, images, _, _ in loader]  # (B, 3, H, W) each

    decoder = model.decoder
    with torch.inference_mode():
        annotations = [model.annotations(images) for images in read_images()]  # (B, L, C) each
        rows = step_rows(decoder, lambda: [model.decode(a, beam) for a in annotations])  # the search captioning runs
        table, w_context = decoder.word_gates()  # (V, 4H), (4H, C)
        w_hh = decoder.lstm.weight_hh  # (4H, H)
        generator = torch.Generator().manual_seed(0)
        inputs = {n: (torch.randn(n, w_context.shape[1], generator=generator),  # z (n, C)
                      torch.randn(n, w_hh.shape[1], generator=generator),  # h (n, H)
                      torch.randn(n, w_hh.shape[1], generator=generator),  # c (n, H)
                      table[torch.randint(0, table.shape[0], (n,), generator=generator)])  # word gates (n, 4H)
                  for n in set(rows)}

        def cells() -> None:
            for n in rows:
                z, h, c, gates = inputs[n]
                torch.lstm_cell(z, (h, c), w_context, w_hh, gates, None)

        def states() -> None:
            for a in annotations:
                decoder.init_state(a)

        seconds = {"images": [], "lstm": [], "state": []}
        for name, fn in (("images", read_images), ("lstm", cells), ("state", states)):
            fn()  # warm-up
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                seconds[name].append(time.perf_counter() - start)
    return {"rows": sum(rows), "steps": len(rows), **{k: median(v) for k, v in seconds.items()}}


def _process_worker(conn, checkpoint, dataset: str, paths: list[str], batch_size: int, beam: int) -> None:
    """One process of a ``ProcessGroup``: one torch thread, its own model; runs "encoder" or "caption" passes
    over its images when told, and answers each with the number of images it handled."""
    torch.set_num_threads(1)
    from captioner.batch.captioning import caption_paths

    model, _ = bench_model(checkpoint, Path(dataset))
    encoder = encoder_pass(model, paths, batch_size)
    jobs = {"encoder": encoder, "caption": lambda: sum(1 for _ in caption_paths(model, paths, beam, batch_size))}
    for job in jobs.values():
        job()  # warm-up
    conn.send("ready")
    while (job := conn.recv()) is not None:
        conn.send(jobs[job]())


class ProcessGroup:
    """``n`` processes (spawned, one torch thread each) that split ``paths`` into contiguous shares, as caption.py's
    ranks do under torchrun; ``run(job)`` starts one pass in all of them and returns when the last has finished."""

    TIMEOUT_S = 600  # the longest a process may take to load its model or to run one pass

    def __init__(self, n: int, checkpoint, dataset: Path, paths: list[Path], batch_size: int, beam: int):
        import multiprocessing

        from captioner.batch.captioning import shard

        context = multiprocessing.get_context("spawn")
        self.conns, self.procs, self.images = [], [], len(paths)
        try:
            for rank in range(n):
                parent, child = context.Pipe()
                share = [str(p) for p in shard(paths, rank, n)]
                proc = context.Process(target=_process_worker, daemon=True,
                                       args=(child, None if checkpoint is None else str(checkpoint), str(dataset),
                                             share, batch_size, beam))
                proc.start()
                child.close()  # the parent's copy: a worker that dies then ends its pipe (EOFError), not a hang
                self.conns.append(parent)
                self.procs.append(proc)
            if self._answers() != ["ready"] * n:
                raise RuntimeError("a benchmark process did not start")
        except BaseException:
            self.close()
            raise

    def _answers(self) -> list:
        """Every process's reply; a process that died ends its pipe, one that hangs runs out of TIMEOUT_S."""
        answers = []
        for conn in self.conns:
            try:
                if not conn.poll(self.TIMEOUT_S):
                    raise RuntimeError(f"a benchmark process did not answer within {self.TIMEOUT_S} s")
                answers.append(conn.recv())
            except EOFError:
                raise RuntimeError("a benchmark process ended unexpectedly (its error is printed above)") from None
        return answers

    def run(self, job: str) -> int:
        for conn in self.conns:
            conn.send(job)
        done = sum(self._answers())
        if done != self.images:
            raise RuntimeError(f"the benchmark processes handled {done} images, not {self.images}")
        return done

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


STAGES = ("decode_image", "encoder", "decoder", "domain")  # caption_once's per-batch stages


def run(args: argparse.Namespace) -> dict:
    dataset = ensure_dataset(Path(getattr(args, "dataset", DATASET)))
    model, source = bench_model(args.checkpoint, dataset)
    paths = _test_paths(dataset, args.speed_images)
    batch_sizes, beams = args.batch_sizes, args.beams
    caption_once(model, paths[: max(batch_sizes)], max(batch_sizes), max(beams))  # warm-up: allocator, kernels
    rows = []
    for batch_size in batch_sizes:
        for beam in beams:
            caption_once(model, paths[:batch_size], batch_size, beam)  # warm-up at this shape
            repeats = [caption_once(model, paths, batch_size, beam) for _ in range(args.speed_repeats)]
            per_repeat = {stage: [sum(b[stage] for b in batches) for batches, _ in repeats]
                          for stage in STAGES}
            totals = [sum(sum(b[k] for k in STAGES) for b in batches) for batches, _ in repeats]
            latencies = [sum(b[k] for k in STAGES) for batches, _ in repeats for b in batches]
            n = len(paths)
            stage_ms = {k: 1000 * median(v) / n for k, v in per_repeat.items()}  # per image
            rows.append({"batch_size": batch_size, "beam": beam, "images": n, "repeats": args.speed_repeats,
                         "images_per_s": n / median(totals),
                         "batch_latency_ms_median": 1000 * median(latencies),
                         "batch_latency_ms_p90": 1000 * p90(latencies),
                         "per_image_ms": {**stage_ms, "total": sum(stage_ms.values())},
                         "decoder_over_encoder": stage_ms["decoder"] / stage_ms["encoder"],
                         "words_per_caption": repeats[0][1] / n})
    e2e = (end_to_end(model, _test_paths(dataset, args.e2e_images), 32, 3, args.speed_repeats,
                      getattr(args, "e2e_processes", 2), args.checkpoint, dataset) if args.e2e_images else None)
    return {"model": source, "environment": environment(), "rows": rows, "end_to_end": e2e}


def markdown(result: dict) -> str:
    rows = []
    for r in result["rows"]:
        ms = r["per_image_ms"]
        batch = f"{r['batch_size']} (one at a time)" if r["batch_size"] == 1 else str(r["batch_size"])
        rows.append([batch, r["beam"], f"{r['images_per_s']:.1f}", f"{r['batch_latency_ms_median']:.0f}",
                     f"{r['batch_latency_ms_p90']:.0f}", f"{ms['decode_image']:.1f}", f"{ms['encoder']:.1f}",
                     f"{ms['decoder']:.1f}", f"{ms['domain']:.2f}", f"{r['decoder_over_encoder']:.2f}",
                     f"{r['words_per_caption']:.1f}"])
    head = ["batch", "beam", "images/s", "batch latency median ms", "p90 ms", "image decoding ms/img",
            "encoder ms/img", "decoder ms/img", "domain check ms/img", "decoder / encoder", "words/caption"]
    n = result["rows"][0]["images"] if result["rows"] else 0
    text = (f"### Captioning speed ({n} test scenes, median of {result['rows'][0]['repeats'] if result['rows'] else 0}"
            f" repeats after warm-up)\nmodel: {result['model']}\n\n" + table(head, rows))
    e2e = result.get("end_to_end")
    if e2e:
        rows = [[k, f"{v:.1f}", f"{e2e['of_encoder'][k]:.2f}"] for k, v in e2e["images_per_s"].items()]
        text += (f"\n\n### End to end against the encoder alone ({e2e['images']} test scenes, batch "
                 f"{e2e['batch_size']}, beam {e2e['beam']}, median of {e2e['repeats']} alternating repeats)\n\n"
                 + table(["path", "images/s", "of encoder-only"], rows))
        least = e2e["floor"]
        ms = lambda seconds: 1000 * seconds / e2e["images"]  # noqa: E731  per image
        encoder_ms = 1000 / e2e["images_per_s"]["encoder only"]
        text += (f"\n\nThe floor beside the encoder: reading the images takes {ms(least['images']):.2f} ms per image and "
                 f"the LSTM cells alone of the {least['rows']} decoder rows beam search steps ({least['steps']} steps, "
                 f"fp32, every other decoder op taken as free) {ms(least['lstm']):.2f} ms, against "
                 f"{encoder_ms:.2f} ms for the encoder: no fp32 decoder of this model can take caption_paths above "
                 f"{least['bound']:.2f} of the encoder-only rate. The decoder's initial state (look-alike channels, "
                 f"attention keys, h_0 and c_0, once per image, as computed here) takes {ms(least['state']):.2f} ms "
                 f"more: with it, {least['bound_with_state']:.2f}.")
        n = e2e.get("processes", 1)
        if n > 1:
            rate = e2e["images_per_s"]
            same = rate[f"caption_paths, {n} processes x 1 thread"] / rate[f"encoder only, {n} processes x 1 thread"]
            threads = result["environment"]["torch_threads"]
            text += (f"\n\nThe 'of encoder-only' column divides by the encoder alone in one process of {threads} torch "
                     f"threads. Like for like ({n} processes x 1 thread each), caption_paths runs at {same:.2f} of the "
                     "encoder alone.")
    return text


def main(args: argparse.Namespace) -> int:
    return run_part("speed", args, run, markdown, quick)


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
