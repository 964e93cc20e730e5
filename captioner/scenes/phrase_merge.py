"""Counting by pointing: phrases that name the same kind of object are said as one phrase with their sum.

With inhibition of return (``captioner.scenes.extension.Named``) a caption's attention leaves each object it has named, so
when the decoder names a (size, colour, shape) again it has looked at another copy of it: "a little orange
triangle, a large pink disc and a little orange triangle" names two triangles, one glimpse each. The references
never write that; they group identical objects in one phrase ("two little orange triangles and a large pink disc").
``merge_repeats`` rewrites a caption that way: the first phrase of each kind takes the number of all its phrases
(a + a = two, two + a = three), its noun the plural, the later ones go, and the phrases are joined as the
references join them ("p1 p2 and p3"; a relation such as "to the left of" stands only between the two phrases it
was said between, so it goes when either merges). Every word of a merged phrase keeps the mean of the attention
maps of the words it stands for, so "two" shows both copies.

A rule on the scenes' words (``captioner.scenes.grammar``), like ``captioner.scenes.repeat_penalty``: a caption whose
phrases do not repeat, or a vocabulary without the scenes' words, is left as it is. Object F1 and scene accuracy do
not change (object multisets are the same); what changes is whether one phrase says the number (count accuracy).
A decoding setting (``merge_repeats``, captioner.scenes.plugin); training and its rewards never see it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from captioner.scenes.grammar import NUMBER_WORDS as WORD_OF  # 2 -> "two" .. 4 -> "four"; no word, no merge
from captioner.scenes.grammar import PLURALS
from captioner.scenes.metrics import parse_objects
from captioner.scenes.phrase_order import NUMBER_WORDS

_PLURAL_NOUNS = frozenset(PLURALS.values())

Sources = list[list[int]]  # for every output word, the input positions whose attention maps it averages


def _phrases(tokens: Sequence[str]) -> list[tuple[int, tuple[str, str, str], int]]:
    """(start position, (size, colour, shape), count) of every "number size colour shape" run of ``tokens``: the
    object phrases ``captioner.evaluation.metrics.parse_objects`` finds that start with a number word."""
    return [(pos[0] - 1, key, count) for key, count, pos in parse_objects(tokens)
            if pos[0] >= 1 and tokens[pos[0] - 1] in NUMBER_WORDS]


def merge_repeats(tokens: Sequence[str]) -> tuple[list[str], Sources]:
    """(the caption's words with repeated kinds merged, each word's source positions in ``tokens``).

    ``["a", "small", "red", "circle", "and", "a", "small", "red", "circle"]`` ->
    ``(["two", "small", "red", "circles"], [[0, 5], [1, 6], [2, 7], [3, 8]])``. Unchanged (each word its own
    source) when no kind is named twice, when the words between phrases are not the scenes' joiners, or when a sum
    has no number word."""
    same = (list(tokens), [[i] for i in range(len(tokens))])
    phrases = _phrases(tokens)
    if len(phrases) < 2:
        return same
    starts = [p[0] for p in phrases]
    if any(b - a < 4 for a, b in zip(starts, starts[1:])):
        return same  # overlapping runs: not the scenes' grammar
    between = [list(tokens[a + 4:b]) for a, b in zip(starts, starts[1:])]
    if any(gap not in ([], ["and"]) for gap in between) and not (len(phrases) == 2 and between[0]):
        return same  # a phrase list is joined by nothing or "and"; only two phrases may hold a relation
    kinds: dict[tuple[str, str, str], list[int]] = {}
    for k, (_, key, _) in enumerate(phrases):
        kinds.setdefault(key, []).append(k)
    if all(len(ks) == 1 for ks in kinds.values()):
        return same
    totals = {key: sum(phrases[k][2] for k in ks) for key, ks in kinds.items()}
    if any(n > 1 and n not in WORD_OF for n in totals.values()):
        return same
    words: list[str] = list(tokens[:starts[0]])
    sources: Sources = [[i] for i in range(starts[0])]
    kept = list(kinds.values())  # in the order of their first phrase
    for n, ks in enumerate(kept):
        if n and n == len(kept) - 1:
            words.append("and")
            sources.append([])  # a joiner put here by the rule: it takes the next word's map (mean_maps)
        first = phrases[ks[0]][0]
        total = totals[phrases[ks[0]][1]]
        for j in range(4):
            word = tokens[first + j]
            if len(ks) > 1 and j == 0:
                word = WORD_OF[total]
            elif len(ks) > 1 and j == 3 and word not in _PLURAL_NOUNS:
                word = PLURALS.get(word, word)
            words.append(word)
            sources.append([phrases[k][0] + j for k in ks])
    last = phrases[-1][0] + 4
    words += tokens[last:]
    sources += [[i] for i in range(last, len(tokens))]
    _agree(words, kept, phrases, tokens)
    return words, sources


def _agree(words: list[str], kept: list[list[int]], phrases, tokens: Sequence[str]) -> None:
    """"there is two ..." -> "there are two ...": the prefix's verb follows the first phrase's number."""
    start = phrases[kept[0][0]][0]
    if start >= 2 and tokens[start - 2] == "there" and tokens[start - 1] in ("is", "are"):
        plural = words[start] not in ("a", "an", "one")
        words[start - 1] = "are" if plural else "is"


def mean_maps(alphas: np.ndarray, sources: Sources) -> np.ndarray:
    """``alphas`` (T, H, W) numpy maps -> (len(sources), H, W): each output word's mean over its sources; a word
    without a source (an added "and") takes the map of the word after it."""
    out = np.zeros((len(sources), *alphas.shape[1:]), dtype=alphas.dtype)
    for k, src in enumerate(sources):
        if src:
            out[k] = alphas[src].mean(axis=0)
    for k in range(len(sources) - 1, -1, -1):
        if not sources[k] and k + 1 < len(sources):
            out[k] = out[k + 1]
    return out
