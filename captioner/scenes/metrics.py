"""Caption-level scene metrics beside object F1: does a caption name exactly the scene's objects, and does it say
how many of each with the right number word?

Object F1 counts objects, not phrases: "a red circle and a red circle" and "two red circles" name the same two
objects. The two measures here tell them apart.

- **scene accuracy**: the share of captions whose multiset of (size, colour, shape) objects equals the scene's
  (a phrase counts as its number word says: "two red circles" is 2, "a red circle and a red circle" is 2 too).
- **count accuracy**: over the groups of identical objects that a caption names at least once, the share named in
  exactly one phrase whose number word equals the group's size, with a plural noun exactly when the size is >= 2
  (the references' way: "a" / "an" for one, "two" .. "four" otherwise). Objects the scene lacks are left to
  object F1 and scene accuracy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from captioner.evaluation.metrics import box_mask, upsample_attention
from captioner.scenes.grammar import NUMBER_WORDS, PLURALS, SHAPE_WORDS, SIZE_WORDS
from captioner.scenes.world import COLORS

# ------------------------------------------------------------------------------------------ object accuracy

_SIZE = {w: s for s, ws in SIZE_WORDS.items() for w in ws}
_SHAPE = {w: s for s, ws in SHAPE_WORDS.items() for w in ws}
_SHAPE.update({PLURALS[w]: s for w, s in list(_SHAPE.items())})
_COUNT = {w: n for n, w in NUMBER_WORDS.items()} | {"a": 1, "an": 1}


def parse_objects(tokens: Sequence[str]) -> list[tuple[tuple[str, str, str], int, list[int]]]:
    """Noun phrases "[count] size colour shape" -> [((size, colour, shape), count, token positions)]."""
    found = []
    for i, tok in enumerate(tokens):
        if tok not in _SHAPE or i < 2:
            continue
        colour, size = tokens[i - 1], tokens[i - 2]
        if colour in COLORS and size in _SIZE:
            count = _COUNT.get(tokens[i - 3], 1) if i >= 3 else 1
            found.append(((_SIZE[size], colour, _SHAPE[tok]), count, [i - 2, i - 1, i]))
    return found


def object_counts(tokens: Sequence[str]) -> Counter:
    c: Counter = Counter()
    for key, count, _ in parse_objects(tokens):
        c[key] += count
    return c


def object_prf(generated: Sequence[Sequence[str]], scenes: Sequence[Sequence[dict]]) -> dict[str, float]:
    """Micro-averaged precision, recall and F1 of the (size, colour, shape) objects named vs. the scene's."""
    tp = n_pred = n_true = 0
    for tokens, objects in zip(generated, scenes):
        pred = object_counts(tokens)
        true = Counter((o["size"], o["color"], o["shape"]) for o in objects)
        tp += sum((pred & true).values())
        n_pred += sum(pred.values())
        n_true += sum(true.values())
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_true if n_true else 0.0
    return {"object_precision": p, "object_recall": r, "object_f1": 2 * p * r / (p + r) if p + r else 0.0}


def attention_correctness(generated: Sequence[Sequence[str]], alphas: Sequence[np.ndarray],
                          scenes: Sequence[Sequence[dict]], image_size: tuple[int, int] = (224, 224),
                          map_size: tuple[int, int] = (224, 224)) -> dict[str, float]:
    """For every generated size/colour/shape word of a phrase that names an object in the scene, the share of
    its upsampled attention inside the union of the boxes of the matching objects; averaged over words.
    Also the same measure for uniform attention (the box area share) as the baseline."""
    shares, uniform = [], []
    for tokens, alpha, objects in zip(generated, alphas, scenes):
        for key, _, positions in parse_objects(tokens):
            boxes = [o["bbox"] for o in objects if (o["size"], o["color"], o["shape"]) == key]
            if not boxes:
                continue
            mask = box_mask(boxes, map_size, image_size)
            for pos in positions:
                if pos < len(alpha):
                    shares.append(float(upsample_attention(alpha[pos], map_size)[mask].sum()))
                    uniform.append(float(mask.float().mean()))
    if not shares:
        return {"attention_correctness": 0.0, "attention_uniform": 0.0, "attention_ratio": 0.0, "attention_words": 0}
    ac, un = float(np.mean(shares)), float(np.mean(uniform))
    return {"attention_correctness": ac, "attention_uniform": un, "attention_ratio": ac / un if un else 0.0,
            "attention_words": len(shares)}



_NUMBER = {w: n for n, w in NUMBER_WORDS.items()} | {"a": 1, "an": 1, "one": 1}
_PLURAL_NOUNS = frozenset(PLURALS.values())

ObjectKey = tuple[str, str, str]  # (size, colour, shape), canonical words


@dataclass(frozen=True)
class Phrase:
    """One noun phrase naming objects: ``number`` is its number word's value (None without one)."""
    key: ObjectKey
    number: int | None
    plural: bool

    @property
    def count(self) -> int:
        """How many objects the phrase names: its number word, else one."""
        return self.number if self.number is not None else 1


def parse_phrases(tokens: Sequence[str]) -> list[Phrase]:
    """The "[number] size colour shape" phrases of a tokenised caption, synonyms mapped to canonical words."""
    phrases = []
    for key, _, positions in parse_objects(tokens):
        first, noun = positions[0], positions[-1]
        number = _NUMBER.get(tokens[first - 1]) if first >= 1 else None
        phrases.append(Phrase(key, number, tokens[noun] in _PLURAL_NOUNS))
    return phrases


def scene_groups(objects: Sequence[dict]) -> Counter:
    """A scene's groups of identical objects: (size, colour, shape) -> how many."""
    return Counter((o["size"], o["color"], o["shape"]) for o in objects)


def names_scene(phrases: Sequence[Phrase], groups: Counter) -> bool:
    """Whether the phrases name exactly the scene's multiset of objects."""
    named: Counter = Counter()
    for phrase in phrases:
        named[phrase.key] += phrase.count
    return named == groups


GROUP_OUTCOMES = ("right", "left out", "too few", "too many", "wrong form", "in several phrases")


def group_outcomes(phrases: Sequence[Phrase], groups: Counter) -> list[tuple[int, str]]:
    """(group size, outcome) for every scene group, outcome one of ``GROUP_OUTCOMES``: counted right, named by no
    phrase, by one phrase that says too few or too many, by one that says the right number in the wrong form (no
    number word, or a plural that disagrees with it: "two small red circle"), or by more than one phrase. Count
    accuracy is the share of "right" among the groups not "left out"."""
    out = []
    for key, size in groups.items():
        naming = [p for p in phrases if p.key == key]
        if not naming:
            outcome = "left out"
        elif len(naming) > 1:
            outcome = "in several phrases"
        elif naming[0].number == size and naming[0].plural == (size >= 2):
            outcome = "right"
        elif naming[0].count != size:
            outcome = "too few" if naming[0].count < size else "too many"
        else:
            outcome = "wrong form"
        out.append((size, outcome))
    return out


def counted_groups(phrases: Sequence[Phrase], groups: Counter) -> list[tuple[int, bool]]:
    """(group size, counted right) for every scene group the phrases name at least once."""
    return [(size, outcome == "right") for size, outcome in group_outcomes(phrases, groups) if outcome != "left out"]


def caption_count_accuracy(tokens: Sequence[str], objects: Sequence[dict], over: str = "named",
                           split_score: float = 0.0) -> float:
    """Share of the scene's groups that one caption counts right (an SCST reward): ``over="named"``, of the groups
    it names (0 when it names none), as count accuracy is measured; ``over="scene"``, of all the scene's groups,
    so that a group left out counts as a wrong number. ``split_score``: what a group named in several phrases
    adds instead of 0 ("a red circle ... a red circle" for two; negative: worse than any other wrong number)."""
    groups = scene_groups(objects)
    named = [o for _, o in group_outcomes(parse_phrases(tokens), groups) if o != "left out"]
    right = named.count("right") + split_score * named.count("in several phrases")
    if over == "named":
        return right / len(named) if named else 0.0
    if over == "scene":
        return right / len(groups) if groups else 0.0
    raise ValueError(f"over must be 'named' or 'scene', got {over!r}")


def scene_count_metrics(generated: Sequence[Sequence[str]], scenes: Sequence[Sequence[dict]]) -> dict[str, float | int]:
    """scene_accuracy, count_accuracy (all named groups), count_accuracy_multi (named groups of >= 2) and the
    number of groups behind each (count_groups, count_groups_multi); an accuracy over no group is 0."""
    exact = 0
    counted: list[tuple[int, bool]] = []
    for tokens, objects in zip(generated, scenes):
        phrases, groups = parse_phrases(tokens), scene_groups(objects)
        exact += names_scene(phrases, groups)
        counted.extend(counted_groups(phrases, groups))
    multi = [ok for size, ok in counted if size >= 2]
    return {"scene_accuracy": exact / len(scenes) if len(scenes) else 0.0,
            "count_accuracy": sum(ok for _, ok in counted) / len(counted) if counted else 0.0,
            "count_accuracy_multi": sum(multi) / len(multi) if multi else 0.0,
            "count_groups": len(counted), "count_groups_multi": len(multi)}
