"""The small grammar that captions a scene: the words for each attribute, noun phrases that name identical
objects together ("two small red circles"), spatial relations, and ``refs`` tying each token to its object."""

from __future__ import annotations

import random

from captioner.scenes.world import SceneObject

# Words the grammar uses for each attribute; the first is the canonical name.
SIZE_WORDS = {"small": ("small", "little"), "large": ("large", "big")}
SHAPE_WORDS = {
    "circle": ("circle", "disc"),
    "square": ("square", "box"),
    "triangle": ("triangle",),
    "star": ("star",),
    "hexagon": ("hexagon",),
    "cross": ("cross",),
}
PLURALS = {"circle": "circles", "disc": "discs", "square": "squares", "box": "boxes", "triangle": "triangles",
           "star": "stars", "hexagon": "hexagons", "cross": "crosses"}
NUMBER_WORDS = {2: "two", 3: "three", 4: "four"}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _noun_phrase(rng: random.Random, key: tuple[str, str, str], count: int) -> list[str]:
    size, color, shape = key
    size_word = rng.choice(SIZE_WORDS[size])
    shape_word = rng.choice(SHAPE_WORDS[shape])
    if count == 1:
        return [_article(size_word), size_word, color, shape_word]
    return [NUMBER_WORDS[count], size_word, color, PLURALS[shape_word]]


def _relation(a: SceneObject, b: SceneObject) -> tuple[str, ...]:
    dx, dy = b.center[0] - a.center[0], b.center[1] - a.center[1]
    if abs(dx) >= abs(dy):
        return ("to", "the", "left", "of") if dx > 0 else ("to", "the", "right", "of")
    return ("above",) if dy > 0 else ("below",)


BACKGROUND_WORDS = {"plain": "plain", "gradient": "shaded", "noise": "noisy", "texture": "patterned"}


def caption_scene(rng: random.Random, objects: list[SceneObject], background: str) -> dict:
    """One caption: {"tokens", "raw", "refs"}; every object of the scene is named exactly once."""
    groups: dict[tuple, list[int]] = {}
    for i, obj in enumerate(objects):
        groups.setdefault(obj.key, []).append(i)
    order = list(groups)
    rng.shuffle(order)
    phrases = [(_noun_phrase(rng, key, len(groups[key])), groups[key][0]) for key in order]

    tokens: list[str] = []
    refs: list[int] = []
    commas: list[int] = []  # token positions after which raw text has a comma

    def add(words, ref=-1):
        tokens.extend(words)
        refs.extend([ref] * len(words))

    first_is_plural = len(groups[order[0]]) > 1
    prefix = rng.choice([(), (), ("there", "are" if first_is_plural else "is"), ("an", "image", "of"),
                         ("a", "picture", "of")])
    add(prefix)
    if len(phrases) == 2 and len(objects) == 2 and rng.random() < 0.7:
        (p1, i1), (p2, i2) = phrases
        add(p1, i1)
        add(_relation(objects[i1], objects[i2]))
        add(p2, i2)
    else:
        for k, (words, idx) in enumerate(phrases):
            if k > 0:
                if k == len(phrases) - 1:
                    add(["and"])
                else:
                    commas.append(len(tokens) - 1)
            add(words, idx)
    if rng.random() < 0.15:
        word = BACKGROUND_WORDS[background]
        add(["on", _article(word), word, "background"])
    raw_words = [t + ("," if i in commas else "") for i, t in enumerate(tokens)]
    raw = " ".join(raw_words)
    return {"tokens": tokens, "raw": raw[0].upper() + raw[1:] + ".", "refs": refs}
