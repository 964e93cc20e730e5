"""Number word last: the decoder names an object before it says how many (scenes plug-in setting ``number_last``).

In the references every noun phrase starts with its number ("two small red circles"), and the phrases come in a
random order. So when the decoder must say "a" or "two" it has not yet said, or looked at, which object the phrase
is about: teacher-forced on the shipped soft model, alpha's peak lay inside the phrase's objects for 62-86% of
number words but 97-100% of nouns, and alpha's entropy told one object from two far better at the noun
(experiments/count_diagnosis.py, docs/benchmarks.md). A model with ``number_last`` is trained on the phrases written
noun first, with a place-holder where the number goes:

    two small red circles   ->   <num> small red circles two
    a big blue square       ->   <num> big blue square a

and its output is put back in the references' order before anyone sees it (``number_first``): each place-holder
takes the number word that ends its phrase, and that word keeps the attention of the step that said it. The
phrases are found by ``refs`` (each token's object, as the synthetic scenes carry them); a sentence without refs
is left as it is.

With ``singular_nouns`` (a plug-in setting) every such noun is also learnt in the singular, so that
the number word alone says how many, one step after the noun, and "crosses" need not be learnt apart from "cross"
for every colour:

    two small red circles   ->   <num> small red circle two

and on output the noun of a phrase whose number word is above one takes its plural again (``reference_order``).
The plurals come from the vocabulary (``plural_table``): the decoder's vocabulary keeps the plural words of the
references, which the decoder is never trained to say. A noun is paired with its plural only when the training
captions use both forms (no guessing "hexagone" from "hexagons"); a plural whose singular they never use stays as it
is, learnt and said as a plural.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

PLACEHOLDER = "<num>"
NUMBER_WORDS = frozenset({"a", "an", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"})


# number words that take a singular noun; every other number word in NUMBER_WORDS takes a plural
SINGULAR_NUMBERS = frozenset({"a", "an", "one"})


def plural_table(words: Iterable[str]) -> dict[str, str]:
    """singular -> plural for every word of ``words`` whose English plural (+s, +es, y -> ies) is also among them:
    {"circle": "circles", "cross": "crosses", "box": "boxes"}. Only phrase nouns are ever looked up; number words
    are never nouns ("a" is not the singular of "as")."""
    known = set(words)
    table = {}
    for word in known - NUMBER_WORDS:
        sibilant = word.endswith(("s", "x", "z", "ch", "sh"))
        candidates = [word + "es", word + "s"] if sibilant else [word + "s", word + "es"]
        if word.endswith("y") and len(word) > 1 and word[-2] not in "aeiou":
            candidates.insert(0, word[:-1] + "ies")
        for plural in candidates:
            if plural in known and plural != word:
                table[word] = plural
                break
    return table


def singular_table(sentences: Iterable[Sequence[str]], min_count: int = 1) -> dict[str, str]:
    """plural -> singular among the words of ``sentences`` seen at least ``min_count`` times (``plural_table``
    turned round): what a ``singular_nouns`` model's training captions write instead of each plural."""
    counts = Counter(word for tokens in sentences for word in tokens)
    table = plural_table(word for word, n in counts.items() if n >= min_count)
    return {plural: word for word, plural in table.items()}


def number_last(tokens: Sequence[str], refs: Sequence[int] | None,
                singular: Mapping[str, str] | None = None) -> tuple[list[str], list[int] | None]:
    """A reference's tokens and refs with every phrase's number word moved behind the phrase (see module doc).

    A phrase is a run of tokens naming the same object (refs[i] >= 0), whose first token is a number word.
    ``singular`` (plural -> singular, ``singular_nouns``): the noun ending a phrase is written in the singular."""
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
            words = list(tokens[i + 1:j])
            if singular is not None:
                words[-1] = singular.get(words[-1], words[-1])
            out_tokens += [PLACEHOLDER, *words, tokens[i]]
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
    return _number_first(tokens)[0]


def reference_order(tokens: Sequence[str], plurals: Mapping[str, str] | None = None) -> tuple[list[int], list[str]]:
    """A ``number_last`` decoder's words in the references' order: (their positions, as ``number_first``, and the
    caption's words). With ``plurals`` (singular -> plural, a ``singular_nouns`` model), the word before a moved
    number word above one (the phrase's noun) takes its plural: "<num> small red circle two" -> "two small red
    circles"."""
    keep, moved = _number_first(tokens)
    words = [tokens[k] for k in keep]
    if plurals:
        where = {k: n for n, k in enumerate(keep)}
        for number, placeholder in moved.items():
            noun = number - 1
            if tokens[number] not in SINGULAR_NUMBERS and noun > placeholder and noun in where:
                words[where[noun]] = plurals.get(tokens[noun], tokens[noun])
    return keep, words


def _number_first(tokens: Sequence[str]) -> tuple[list[int], dict[int, int]]:
    """``number_first``'s positions, and each moved number word's position -> its place-holder's."""
    keep: list[int] = []
    moved: dict[int, int] = {}
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
                moved[j] = i
                break
    return keep, moved


def number_last_split(split, singular: Mapping[str, str] | None = None):
    """A copy of a ``KarpathySplit`` whose sentences are written number last (tokens and refs; ``raw`` kept);
    ``singular`` (plural -> singular): nouns in the singular as well (``singular_nouns``)."""
    import copy

    out = copy.copy(split)
    out.records = []
    for record in split.records:
        sentences = []
        for s in record["sentences"]:
            tokens, refs = number_last(s["tokens"], s.get("refs"), singular)
            sentences.append({**s, "tokens": tokens, **({} if refs is None else {"refs": refs})})
        out.records.append({**record, "sentences": sentences})
    return out
