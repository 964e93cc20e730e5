"""Tokenisation and the word vocabulary (no downloaded data needed)."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from captioner.errors import CheckpointError

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)
MAX_VOCAB = 100_000  # words, special tokens included (ModelConfig.vocab_size has the same limit)
MAX_VOCAB_BYTES = 20_000_000  # vocab.json files larger than this are not read
MAX_WORD_CHARS = 100
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
# Typographic apostrophes and quotes read as the ASCII ones: "knight’s" is the same word as "knight's"
_ASCII_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u2032": "'",
                               "\u201c": '"', "\u201d": '"', "\u201e": '"'})


def tokenize(text: str) -> list[str]:
    """Lower-case words and numbers; punctuation dropped (as in Karpathy's preprocessed captions). Curly
    apostrophes and quotes count as the ASCII ones, so a typeset caption gives the same words as a typed one."""
    return _WORD.findall(text.translate(_ASCII_QUOTES).lower())


class Vocabulary:
    """Index <-> word mapping with the four special tokens first (pad=0, start=1, end=2, unk=3)."""

    def __init__(self, words: Iterable[str]):
        self.itos: list[str] = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("vocabulary words must be unique")

    pad_index, start_index, end_index, unk_index = 0, 1, 2, 3

    @classmethod
    def build(cls, sentences: Iterable[list[str]], min_count: int = 5) -> "Vocabulary":
        """Keep words seen at least ``min_count`` times, most frequent first (ties alphabetical)."""
        counts = Counter(w for tokens in sentences for w in tokens)
        kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        return cls(kept)

    def __len__(self) -> int:
        return len(self.itos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.itos == other.itos

    def encode(self, tokens: list[str], add_markers: bool = True) -> list[int]:
        ids = [self.stoi.get(t, self.unk_index) for t in tokens]
        return [self.start_index, *ids, self.end_index] if add_markers else ids

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Words up to the first <end>, without <start>/<pad>."""
        words = []
        for i in ids:
            i = int(i)
            if i == self.end_index:
                break
            if i in (self.pad_index, self.start_index):
                continue
            words.append(self.itos[i])
        return words

    def to_json(self) -> str:
        return json.dumps({"itos": self.itos}, indent=0)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "Vocabulary":
        """Read a vocab.json ({"itos": [words]}), checked before use: a list of unique non-empty strings, the
        special tokens first, at most MAX_VOCAB entries. Anything else raises one CheckpointError line."""
        path = Path(path)
        try:
            size = path.stat().st_size
            if size > MAX_VOCAB_BYTES:
                raise CheckpointError(f"{path} is {size} bytes, too large for a vocabulary "
                                      f"(at most {MAX_VOCAB_BYTES}).")
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{path} is not a readable vocabulary file ({e.__class__.__name__}).") from None
        if not isinstance(data, dict) or "itos" not in data:
            raise CheckpointError(f"{path} is not a vocabulary file: expected a JSON object with an \"itos\" list "
                                  f"of words, found a {type(data).__name__}.")
        itos = data["itos"]
        if not isinstance(itos, list):
            raise CheckpointError(f"{path}: \"itos\" is a {type(itos).__name__}, not a list of words.")
        if not len(SPECIALS) < len(itos) <= MAX_VOCAB:
            raise CheckpointError(f"{path} holds {len(itos)} entries; a vocabulary has the {len(SPECIALS)} special "
                                  f"tokens and 1 to {MAX_VOCAB - len(SPECIALS)} words.")
        seen: dict[str, int] = {}
        for i, word in enumerate(itos):
            if not isinstance(word, str) or not 0 < len(word) <= MAX_WORD_CHARS:
                raise CheckpointError(f"{path}: entry {i} is {json.dumps(word)[:40]}, not a word (a string of 1 to "
                                      f"{MAX_WORD_CHARS} characters).")
            if word in seen:
                raise CheckpointError(f"{path}: entry {i} {word[:40]!r} repeats entry {seen[word]}; "
                                      "words must be unique.")
            seen[word] = i
        if list(itos[:4]) != list(SPECIALS):
            raise CheckpointError(f"{path} does not start with the special tokens {SPECIALS}.")
        return cls(itos[4:])
