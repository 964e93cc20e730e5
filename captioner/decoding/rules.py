"""The rules beam search follows, in plain Python, shared by the PyTorch search (``captioner.decoding.search``) and the numpy
one of the route without torch (``captioner.runtime.search``), so that both rank, break ties and record alike:
which candidates become live beams and which finished hypotheses, the score hypotheses are ranked by, the checks on
a beam size, and the walk back through the steps that gathers a hypothesis' recorded values. Nothing here imports
torch or numpy; each search turns the lists into its own arrays.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from captioner.errors import CaptionerError

NEG = float("-inf")


class NonFiniteScoresError(CaptionerError):
    """The decoder gave NaN word scores: its weights or its input hold non-finite values."""


@dataclass
class Hypothesis:
    """One caption a search found, on either route (its arrays are torch tensors or numpy arrays)."""
    words: list[int]
    alphas: Any  # (T, L): alphas[i] produced words[i]
    log_prob: float
    ended: bool = True  # False when cut by max_len
    # beam search with ``measure=True``: per word, (p(word) from the raw scores, the gate beta (NaN without the
    # gate), the attention entropy in nats) as (T, 3) float64, else None
    measures: Any = None

    def score(self, length_penalty: float) -> float:
        return ranking_score(self.log_prob, len(self.words), self.ended, length_penalty)


def ranking_score(log_prob: float, words: int, ended: bool, length_penalty: float) -> float:
    """What hypotheses are ranked by: ``log_prob / len(words + <end>) ** length_penalty`` (the raw log-probability
    without a penalty; a caption cut at max_len has no <end>)."""
    n = words + int(ended)
    return log_prob / (max(n, 1) ** length_penalty) if length_penalty else log_prob


def select_beams(top_scores: list[list[float]], top_ids: list[list[int]], width: int, V: int, K: int, end: int,
                 ) -> tuple[list[list[float]], list[list[int]], list[list[int]], list[tuple[int, int]]]:
    """Every image's next beams, from its candidates (n rows of 2K, best first; ids index ``width * V``).

    Walking an image's candidates in order, an <end> becomes a finished hypothesis and any other word a live beam,
    until K live beams are found (a -inf candidate is never taken). Returns the live beams' scores (n, K) (-inf
    where fewer than K exist), the rows they continue (n, K), their words (n, K) (``end`` in unused slots), and the
    (image, candidate position) pairs of the <end>s taken.

    The walk runs over Python lists: assigning tensor elements one by one cost a dispatched copy each (a third of
    the selection time of a batch of 32), and a fully vectorised version (masks, cumsum, argsort, gathers) costs
    more small ops per step than one image has candidates.
    """
    n = len(top_scores)
    new_scores, new_src, new_words = [[NEG] * K for _ in range(n)], [[0] * K for _ in range(n)], \
        [[end] * K for _ in range(n)]
    ended: list[tuple[int, int]] = []
    for j, (row_scores, row_ids) in enumerate(zip(top_scores, top_ids)):
        kept = 0
        for position, (score, idx) in enumerate(zip(row_scores, row_ids)):
            if score == NEG or kept == K:
                break
            word = idx % V
            if word == end:
                ended.append((j, position))
            else:
                new_scores[j][kept], new_src[j][kept], new_words[j][kept] = score, j * width + idx // V, word
                kept += 1
    return new_scores, new_src, new_words, ended


def whole(value, name: str, low: int, high: int | None) -> int:
    """``value`` as an int (numpy integers too; not bools or floats) within [low, high], else a ValueError."""
    try:
        number = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        number = None
    if number is None or number < low or (high is not None and number > high):
        bounds = f"at least {low}" if high is None else f"between {low} and beam_size ({high})"
        raise ValueError(f"{name} must be a whole number {bounds}, not {value!r}")
    return number


def walk_measures(pending: Sequence[tuple], measure_steps: Sequence, parents: Sequence,
                  ) -> Iterator[tuple[object, list[tuple[float, float, float]]]]:
    """Per pending (hypothesis, steps, row after them): the hypothesis and, per word, (p(word), beta, entropy),
    read from the row of each step that produced the word. ``measure_steps[t]``: rows of (beta, entropy, log p of
    every word); ``parents[t]``: the row of step t each row of step t + 1 continues."""
    for hyp, n, row in pending:
        values: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)] * n
        for step in range(n - 1, -1, -1):
            row = int(parents[step][row])
            record = measure_steps[step][row]
            values[step] = (math.exp(float(record[2 + hyp.words[step]])), float(record[0]), float(record[1]))
        yield hyp, values
