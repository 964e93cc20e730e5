"""A decoding rule for the synthetic scenes: a caption names each kind of object once.

The references group identical objects in one phrase with its number word ("two small red circles"); they never
name the same (size, colour, shape) twice. The decoder sometimes does: "a small red circle ... a small red circle"
for a pair (one phrase too few at the number word) or for a single object it has already named. At the step that
would end such a phrase, the noun that repeats an earlier phrase's (size, colour, shape) (synonyms included: "big" is
"large", "disc" is "circle") loses ``weight`` from its log-probability, so beam search keeps the hypothesis that said
"two" where the model was unsure, and only a decoder that is sure of the repeat still writes it. A penalty rather
than a ban: a ban (``weight = inf``) made the decoder swap in another shape (a wrong object) where it had no other
hypothesis, and object F1 fell (docs/experiments/counting.md).

Works on surface word ids, so it needs no model change and applies to greedy and beam search alike; the history
of each row is what ``captioner.decoding.search`` already keeps. Words are those of ``captioner.scenes.grammar``; a
vocabulary without them (real photographs' captions) is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from captioner.scenes.grammar import PLURALS, SHAPE_WORDS, SIZE_WORDS
from captioner.scenes.world import COLORS


class RepeatPenalty:
    """``(history (R, t) word ids, logp (R, V)) -> logp``, lowering the nouns that would repeat a named object.

    numpy inside, so that both routes apply it: ONNX Runtime's (captioner.runtime) passes numpy arrays, PyTorch's
    beam search CPU tensors, which ``np.asarray`` views without a copy (``logp`` is changed in place either way)."""

    def __init__(self, itos: Sequence[str], weight: float):
        size_of = {w: i for i, ws in enumerate(SIZE_WORDS.values()) for w in ws}
        shape_class = {w: i for i, ws in enumerate(SHAPE_WORDS.values()) for w in ws}
        shape_class |= {PLURALS[w]: i for w, i in list(shape_class.items()) if w in PLURALS}
        colour_of = {w: i for i, w in enumerate(COLORS)}
        self.weight = float(weight)
        self.n_shapes = len(SHAPE_WORDS)
        self.size_of = np.array([size_of.get(w, -1) for w in itos], dtype=np.int64)  # (V,) -1: not a size word
        self.colour_of = np.array([colour_of.get(w, -1) for w in itos], dtype=np.int64)  # (V,)
        self.shape_of = np.array([shape_class.get(w, -1) for w in itos], dtype=np.int64)  # (V,)
        self.nouns = np.flatnonzero(self.shape_of >= 0)  # (N,) the vocabulary's shape words
        self.active = bool(self.weight) and len(self.nouns) > 0 and bool((self.size_of >= 0).any()) \
            and bool((self.colour_of >= 0).any())

    def __call__(self, history, logp):
        words, scores = np.asarray(history), np.asarray(logp)  # (R, t), (R, V): views of CPU tensors
        if not self.active or words.shape[1] < 2:
            return logp
        size, colour = self.size_of[words[:, -2]], self.colour_of[words[:, -1]]  # (R,) the open phrase's
        rows = np.flatnonzero((size >= 0) & (colour >= 0))  # rows whose next word may be a noun
        if not len(rows) or words.shape[1] < 3:
            return logp
        past = words[rows]  # (r, t)
        sizes, colours, shapes = self.size_of[past[:, :-2]], self.colour_of[past[:, 1:-1]], \
            self.shape_of[past[:, 2:]]  # (r, t - 2): each earlier "size colour noun" run
        same = (sizes == size[rows, None]) & (colours == colour[rows, None]) & (shapes >= 0)  # (r, t - 2)
        named = np.zeros((len(rows), self.n_shapes + 1))  # (r, shapes + 1): last column collects the non-matches
        named[np.arange(len(rows))[:, None], np.where(same, shapes, self.n_shapes)] = 1.0
        repeats = named[:, self.shape_of[self.nouns]] > 0  # (r, N)
        penalty = np.where(repeats, self.weight, 0.0).astype(scores.dtype)  # (r, N); a ban (inf) stays -inf, no NaN
        scores[rows[:, None], self.nouns[None, :]] -= penalty
        return logp
