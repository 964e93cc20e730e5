"""Signs that a training run is going nowhere, each as one ``warning: ...`` line that names the flag to change.

Pure functions of what the run already has (the training captions and vocabulary, the splits' references, an
epoch's mean loss parts, the decoded val captions); each returns the warning's text or None. ``fit`` prints each
kind once and records them (``RunWarnings``): in the epoch's metrics.jsonl record and in the run's warnings.json.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from captioner.files import atomic_write
from captioner.vocab import SPECIALS, Vocabulary

FILENAME = "warnings.json"  # in the run folder: every warning of the run, with when it was raised
UNK_SHARE = 0.10  # of the training caption words: more become <unk> and the captions say little
REGULARISER_SHARE = 0.80  # of the epoch's mean total loss: more and the words barely steer the gradient
COLLAPSED = 2  # this many distinct val captions or fewer: the model says the same thing for every image
MIN_COLLAPSE_IMAGES = 5  # a val split smaller than this can not show a collapse
# epoch warnings raised only once they hold this many epochs in a row: every run's first epochs write one caption
PERSISTS = {"collapse": 3}
# a loss part -> the flag that weighs it (the training loop logs the unweighted parts; the total is weighted)
REGULARISER_FLAGS = {"ds": "--lambda-ds", "att": "--lambda-att", "alpha_entropy": "--entropy-penalty"}
REGULARISER_NAMES = {"ds": "the doubly stochastic attention term", "att": "the supervised attention term",
                     "alpha_entropy": "the attention entropy penalty"}


def unk_share_warning(sentences: Sequence[Sequence[str]], vocab: Vocabulary, min_word_count: int,
                      limit: float = UNK_SHARE) -> str | None:
    """More than ``limit`` of the words of ``sentences`` (the training captions' tokens) are outside
    ``vocab``."""
    total = sum(len(s) for s in sentences)
    unknown = sum(1 for s in sentences for w in s if w not in vocab.stoi)
    if not total or unknown / total <= limit:
        return None
    words = len(vocab) - len(SPECIALS)
    return (f"{100 * unknown / total:.0f}% of the training words are <unk> (vocabulary of {words} words with "
            f"--min-word-count {min_word_count}); lower --min-word-count")


def single_reference_warning(split: str, references_per_image: Sequence[int]) -> str | None:
    """Most images of ``split`` (val or a test split) have at most one reference caption."""
    single = sum(1 for n in references_per_image if n <= 1)
    if not references_per_image or single * 2 <= len(references_per_image):
        return None
    return (f"{split} has one reference caption per image ({single} of {len(references_per_image)} images): "
            f"BLEU and CIDEr-D against one reference are lower and noisier than the published figures, which use "
            f"5 per image; compare runs on this data with each other, not with papers")


def collapse_warning(captions: Sequence[str], collapsed: int = COLLAPSED,
                     min_images: int = MIN_COLLAPSE_IMAGES) -> str | None:
    """The decoded val ``captions`` are ``collapsed`` or fewer distinct strings."""
    counts = Counter(captions)
    if len(captions) < min_images or len(counts) > collapsed:
        return None
    distinct = [c for c, _ in counts.most_common()]
    shown = " / ".join(repr(c) for c in distinct)
    return (f"the {len(captions)} val captions are {len(distinct)} distinct string{'s' * (len(distinct) > 1)} "
            f"({shown}); the model says the same thing for every image: lower --min-word-count, --lambda-ds, or "
            f"train longer (--epochs, --patience)")


def regulariser_warning(train: dict[str, float], weights: dict[str, float],
                        limit: float = REGULARISER_SHARE) -> str | None:
    """A weighted regulariser part of an epoch's mean loss (``train``: "loss" and the unweighted parts) above
    ``limit`` of the total. ``weights``: part -> its weight (``{"ds": lambda_ds, ...}``)."""
    total = train.get("loss")
    if not total or total <= 0:
        return None
    for part, flag in REGULARISER_FLAGS.items():
        weighted = weights.get(part, 0.0) * train.get(part, 0.0)
        if weighted / total > limit:
            return (f"{REGULARISER_NAMES[part]} ({part} {train[part]:.3f} x {weights[part]:g}) is "
                    f"{100 * weighted / total:.0f}% of the training loss {total:.3f}; the words barely steer "
                    f"training: lower {flag}")
    return None


class RunWarnings:
    """Prints each kind of warning once (stderr) and keeps every one in ``folder/warnings.json``: a list of
    {"when", "kind", "text"}; on resume the file's earlier warnings stay."""

    def __init__(self, folder: Path | None, resume: bool = False):
        self.path = Path(folder) / FILENAME if folder is not None else None
        self.records: list[dict] = []
        if resume and self.path is not None and self.path.is_file():
            try:
                self.records = list(json.loads(self.path.read_text()))
            except (OSError, ValueError, TypeError):
                self.records = []  # a damaged file: start a new list
        self.printed: set[str] = set()
        self.streaks: dict[str, int] = {}  # kind -> epochs in a row it came up

    def due(self, found: dict[str, str]) -> dict[str, str]:
        """This epoch's warnings (kind -> text) less those of a ``PERSISTS`` kind that has not yet come up that many
        epochs in a row (their text then says for how many)."""
        self.streaks = {kind: self.streaks.get(kind, 0) + 1 for kind in found}
        out = {}
        for kind, text in found.items():
            need = PERSISTS.get(kind, 1)
            if self.streaks[kind] >= need:
                out[kind] = text if need == 1 else f"{text} (for {self.streaks[kind]} epochs in a row)"
        return out

    def add(self, kind: str, text: str | None, when: str) -> str | None:
        """Record ``text`` (None: nothing to say) as raised ``when`` ("before training", "epoch 3"); print it the
        first time its ``kind`` comes up. Returns the text."""
        if text is None:
            return None
        if kind not in self.printed:
            print(f"warning: {text}", file=sys.stderr, flush=True)
            self.printed.add(kind)
        record = {"when": when, "kind": kind, "text": text}
        if record not in self.records:
            self.records.append(record)
            if self.path is not None:
                atomic_write(self.path, json.dumps(self.records, indent=1))
        return text
