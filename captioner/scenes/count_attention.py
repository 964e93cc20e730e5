"""Counting with attention: a number word above one must have looked at more than one place.

A ``number_last`` decoder says each phrase's number word once attention is on the object, and that word's
attention is what inhibition of return marks as counted (``captioner.scenes.extension.Named``). When the word says "two" (or
more) while its attention lies all on one object (nothing beyond ``RADIUS`` cells of its peak, where a second copy
would have to be), the hard model is nearly always wrong: on val it said "two" that way for 10 single objects and 5
pairs, on the test_novel scenes of an unused seed for 11 single objects and 1 pair (docs/experiments/counting.md).
``said_as_one`` says such a phrase in the singular ("two small red circles" -> "a small red circle").

A rule on the scenes' words (``captioner.scenes.grammar``), like ``captioner.scenes.phrase_merge``: a caption without
them is left as it is. It runs before ``merge_repeats``, so two phrases that each looked at one copy still merge
into "two". A decoding setting (``plural_spread``, the least attention mass the number word must put
beyond its peak's neighbourhood); training and its rewards never see it. The attention maps are not changed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from captioner.scenes.grammar import PLURALS
from captioner.scenes.metrics import parse_objects
from captioner.scenes.phrase_order import NUMBER_WORDS, SINGULAR_NUMBERS

RADIUS = 2  # cells around the peak that count as its object: a small object spans about 3 cells of 16 px
SINGULARS = {plural: singular for singular, plural in PLURALS.items()}


def spread_beyond_peak(alpha: np.ndarray, radius: int = RADIUS) -> float:
    """alpha (H, W), one word's attention -> the share of its mass farther than ``radius`` cells (in rows or
    columns) from its largest cell: near 0 when it covers one object, large when it covers two far apart."""
    total = float(alpha.sum())
    if total <= 0:
        return 0.0
    r, c = np.unravel_index(int(alpha.argmax()), alpha.shape)
    near = float(alpha[max(0, r - radius):r + radius + 1, max(0, c - radius):c + radius + 1].sum())
    return max(0.0, 1.0 - near / total)


def said_as_one(tokens: Sequence[str], alphas: np.ndarray, min_spread: float) -> list[str]:
    """``tokens`` (T,) of a caption in reading order, ``alphas`` (T, H, W) the attention each was said with -> the
    words with every "two .. four <size> <colour> <plural>" phrase whose number word's attention spreads less than
    ``min_spread`` beyond its peak said as one ("a" or "an", the noun's singular). ``min_spread`` 0: unchanged."""
    words = list(tokens)
    if min_spread <= 0 or len(alphas) != len(words):
        return words
    first_changed = None
    for _, _, (start, _, noun) in parse_objects(words):
        at = start - 1
        if at < 0 or words[at] not in NUMBER_WORDS or words[at] in SINGULAR_NUMBERS:
            continue
        if words[noun] not in SINGULARS or spread_beyond_peak(alphas[at]) >= min_spread:
            continue
        words[at] = "an" if words[start][0] in "aeiou" else "a"
        words[noun] = SINGULARS[words[noun]]
        first_changed = at if first_changed is None else first_changed
    if first_changed is not None and first_changed >= 2 and words[first_changed - 2:first_changed] == ["there", "are"]:
        words[first_changed - 1] = "is"  # "there are two red circles" -> "there is a red circle"
    return words
