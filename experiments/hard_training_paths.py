"""Hard attention's two training passes, in the slow form they had and with soft attention's fast paths.

    python -m experiments.hard_training_paths [--checkpoint checkpoints/shapes-hard] [--images 32] [--repeats 5]
        [--threads 1]

On the shipped hard checkpoint and ``--images`` encoded test scenes (not timed), with the decoder in training mode:

* cross-entropy: a teacher-forced forward and backward of 5 captions per image (the checkpoint's own samples, so
  their lengths are the model's), with the sampled context (REINFORCE through the location) and with the expected
  one; the step loop (``Decoder.forward`` as before) against ``captioner.model.teacher_forcing`` (the step-independent
  work out of the loop, keys and values read through ``step_grad.StepReads``);
* self-critical: drawing 5 samples per image with the sampled context and the backward of their loss; every row
  stepped until the longest sample ends, against stepping only the samples still running
  (``captioner.training.scst.drops_finished_rows``).

Each cell is the median of ``--repeats`` timed calls after one untimed call, one process, ``--threads`` torch
threads. The same seed is set before every call, so each path draws the same way on each call.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.common import (DATASET, ROOT, bench_model, ensure_dataset, environment, environment_line, median,
                          set_threads, table)

HARD = ROOT / "checkpoints" / "shapes-hard"


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=str(HARD), help="a hard-attention checkpoint (default: %(default)s)")
    p.add_argument("--images", type=int, default=32, help="test scenes per batch (default: %(default)s)")
    p.add_argument("--samples", type=int, default=5, help="captions per image (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per cell (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    return p


def main(args: argparse.Namespace) -> int:
    import torch

    from captioner.training import scst

    from captioner.model import teacher_forcing
    from captioner.data.karpathy import KarpathySplit
    from captioner.images import open_image
    from captioner.training.losses import HardAttentionObjective, caption_loss

    set_threads(args.threads)
    ensure_dataset()
    model, description = bench_model(args.checkpoint)
    decoder, vocab = model.decoder, model.vocab
    if decoder.attention is None or not decoder.attention.hard:
        print(f"error: {args.checkpoint} is not a hard-attention checkpoint", file=sys.stderr)
        return 2
    paths = KarpathySplit.load(DATASET, "test").image_paths[:args.images]
    transform = model.preprocessing.transform()
    with torch.no_grad():
        annotations = model.encode(torch.stack([transform(open_image(p)) for p in paths]))  # (B, L, C)
    decoder.train()
    n, max_len = args.samples, model.decoding.max_len
    torch.manual_seed(0)
    with torch.no_grad():
        drawn = scst.sample_captions(decoder, annotations, n, vocab.start_index, vocab.end_index, max_len, False)
    lengths = drawn.mask.sum(1) + 1  # (B n,) <start> + the words up to <end>
    captions = torch.cat([torch.full((lengths.shape[0], 1), vocab.start_index), drawn.words], 1)  # (B n, T + 1)
    rows = annotations.repeat_interleave(n, 0)  # (B n, L, C)
    objective = HardAttentionObjective(baseline=-5.0)
    advantage = torch.linspace(-1, 1, lengths.shape[0])

    def teacher_forced(sample_prob: float):
        def run() -> None:
            out = decoder(rows, captions, lengths, sample_prob=sample_prob)
            caption_loss(out, captions[:, 1:], lambda_ds=0.0, hard=objective)[0].backward()
        return run

    def self_critical() -> None:
        samples = scst.sample_captions(decoder, annotations, n, vocab.start_index, vocab.end_index, max_len, True,
                                       as_decoded=True)
        scst.scst_loss(samples, advantage, objective.entropy_weight).backward()

    def seconds(run, slow: bool) -> float:
        supports, drops = teacher_forcing.supports, scst.drops_finished_rows
        if slow:
            teacher_forcing.supports = lambda d: False
            scst.drops_finished_rows = lambda d, a: False
        try:
            times = []
            for i in range(args.repeats + 1):
                torch.manual_seed(1)
                decoder.zero_grad(set_to_none=True)
                start = time.process_time()
                run()
                if i:
                    times.append(time.process_time() - start)
            return median(times)
        finally:
            teacher_forcing.supports, scst.drops_finished_rows = supports, drops

    cases = [("cross-entropy, sampled context", teacher_forced(1.0)),
             ("cross-entropy, expected context", teacher_forced(0.0)),
             ("self-critical, sampled context", self_critical)]
    body = []
    for name, run in cases:
        slow, fast = seconds(run, True), seconds(run, False)
        body.append([name, f"{1e3 * slow:.0f}", f"{1e3 * fast:.0f}", f"{slow / fast:.2f}x"])
    print(environment_line(environment()))
    print(f"model: {description}; {len(paths)} test scenes x {n} captions ({float(lengths.float().mean()) - 1:.1f} "
          f"words + <end> on average, longest {int(lengths.max()) - 1}); {args.threads} thread(s); CPU ms per "
          f"forward + backward, median of {args.repeats}")
    print(table(["pass", "before (step loop, every row)", "after (fast path)", "speed-up"], body))
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
