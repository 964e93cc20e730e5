"""The scenes' side of captions steered by regions (``captioner.decoding.regions``): where a phrase of their captions ends,
and whether a steered caption named the objects in its regions (``region_metrics``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from captioner.decoding.regions import PhraseRule
from captioner.scenes.grammar import PLURALS, SHAPE_WORDS
from captioner.scenes.metrics import parse_phrases
from captioner.scenes.phrase_order import NUMBER_WORDS, PLACEHOLDER

def phrase_rule(stoi: Mapping[str, int]) -> PhraseRule:
    """A ``number_last`` vocabulary (with ``<num>``) writes "<num> small red circle a": a phrase opens at ``<num>``
    and ends at its number word (the word that also closes it for inhibition of return). Other vocabularies write
    "a small red circle": a phrase ends at its noun."""
    def ids(words):
        return frozenset(stoi[w] for w in words if w in stoi)

    if PLACEHOLDER in stoi:
        return PhraseRule(ids(NUMBER_WORDS), stoi[PLACEHOLDER])
    return PhraseRule(ids({w for ws in SHAPE_WORDS.values() for w in ws} | set(PLURALS.values())))


def _key(obj: Mapping) -> tuple[str, str, str]:
    return obj["size"], obj["color"], obj["shape"]


def region_metrics(objects: Sequence[Sequence[Mapping]], tokens: Sequence[Sequence[str]]) -> dict[str, float]:
    """Per steered caption, the scene objects its regions were drawn around (in order) and its words ->
    ``regions_named``: the share of captions whose phrases name exactly those objects, one phrase each, in that
    order, each as one object of the right size, colour and shape (and no other object);
    ``regions_colour_shape``: the same with colour and shape only (any size or number word)."""
    exact = loose = 0
    for boxed, words in zip(objects, tokens):
        phrases = parse_phrases(words)
        keys = [_key(o) for o in boxed]
        exact += [p.key for p in phrases] == keys and all(p.count == 1 and not p.plural for p in phrases)
        loose += [p.key[1:] for p in phrases] == [k[1:] for k in keys]
    n = len(objects)
    return {"regions_named": exact / n if n else 0.0, "regions_colour_shape": loose / n if n else 0.0}
