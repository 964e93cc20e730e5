"""Number word last: the decoder names an object before it says how many (``ModelConfig.number_last``, issue 21).

In the references every noun phrase starts with its number ("two small red circles"), and the phrases come in a
random order. So when the decoder must say "a" or "two" it has not yet said, or looked at, which object the phrase
is about: teacher-forced on the shipped soft model, alpha's peak lay inside the phrase's objects for 62-86% of
number words but 97-100% of nouns, and alpha's entropy told one object from two far better at the noun
(bench/count_diagnosis.py, docs/benchmarks.md). A model with ``number_last`` is trained on the phrases written
noun first, with a place-holder where the number goes:

    two small red circles   ->   <num> small red circles two
    a big blue square       ->   <num> big blue square a

and its output is put back in the references' order before anyone sees it (``number_first``): each place-holder
takes the number word that ends its phrase, and that word keeps the attention of the step that said it. The
phrases are found by ``refs`` (each token's object, as the synthetic scenes carry them); a sentence without refs
is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

PLACEHOLDER = "<num>"
NUMBER_WORDS = frozenset({"a", "an", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"})


def number_last(tokens: Sequence[str], refs: Sequence[int] | None) -> tuple[list[str], list[int] | None]:
    """A reference's tokens and refs with every phrase's number word moved behind the phrase (see module doc).

    A phrase is a run of tokens naming the same object (refs[i] >= 0), whose first token is a number word."""
    if refs is None or len(refs) != len(tokens):
        return list(tokens), None if refs is None else list(refs)
    out_tokens: list[str] = []
    out_refs: list[int] = []
    i = 0
    while i < len(tokens):
        j = i + 1
        while j < len(tokens) and refs[i] >= 0 and refs[j] == refs[i]:
            j += 1  # tokens[i:j]: one phrase (or one token naming nothing)
        if refs[i] >= 0 and j - i > 1 and tokens[i] in NUMBER_WORDS:
            out_tokens += [PLACEHOLDER, *tokens[i + 1:j], tokens[i]]
            out_refs += [refs[i]] * (j - i + 1)
        else:
            out_tokens += tokens[i:j]
            out_refs += refs[i:j]
        i = j
    return out_tokens, out_refs


# The scenes' phrases put size, colour and shape between the number and the phrase's end: a number word further
# from its place-holder belongs to something else ("on a plain background"), and the place-holder is dropped.
PHRASE_WORDS = 3


def number_first(tokens: Sequence[str]) -> list[int]:
    """The positions of ``tokens`` (a ``number_last`` decoder's words) in the references' order: each place-holder
    is replaced by the number word that ends its phrase (at most ``PHRASE_WORDS`` words after it, before the next
    place-holder), which leaves its own place; a place-holder with none is dropped.
    ``[tokens[k] for k in number_first(tokens)]`` is the caption."""
    keep: list[int] = []
    moved: set[int] = set()
    for i, word in enumerate(tokens):
        if i in moved:
            continue
        if word != PLACEHOLDER:
            keep.append(i)
            continue
        for j in range(i + 1, min(len(tokens), i + PHRASE_WORDS + 2)):
            if tokens[j] == PLACEHOLDER:
                break
            if tokens[j] in NUMBER_WORDS:
                keep.append(j)
                moved.add(j)
                break
    return keep


def number_last_split(split):
    """A copy of a ``KarpathySplit`` whose sentences are written number last (tokens and refs; ``raw`` kept)."""
    import copy

    out = copy.copy(split)
    out.records = []
    for record in split.records:
        sentences = []
        for s in record["sentences"]:
            tokens, refs = number_last(s["tokens"], s.get("refs"))
            sentences.append({**s, "tokens": tokens, **({} if refs is None else {"refs": refs})})
        out.records.append({**record, "sentences": sentences})
    return out
