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

from captioner.scenes.grammar import NUMBER_WORDS, PLURALS
from captioner.metrics import parse_objects

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
