"""Settings chosen from the data, for a dataset that has no recipe of its own (``train.py --dataset mine``).

Two numbers of the training split decide them: how many training captions there are (vocabulary threshold,
model size, batch, learning rate, epochs, patience: one row of ``BANDS``) and how many words a caption has on
average (the weight of the doubly stochastic regulariser: ``LAMBDA_BY_LENGTH``). The largest band is the paper's
setting, as in the Flickr and COCO recipes; the smallest suits a few hundred pictures with one short caption
each. docs/datasets.md shows the table. Flags still override every value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


from captioner.data.karpathy import SPLIT_ALIASES, dataset_plugin, load_karpathy_json


@dataclass(frozen=True)
class Band:
    """The settings of one dataset size (training captions below ``below``)."""
    below: float
    min_word_count: int
    dims: tuple[int, int, int]  # embed, hidden (LSTM), attention
    batch_size: int
    lr: float
    epochs: int
    patience: int


# Few captions: keep every word (a word seen once is still a word the model can say; <unk> never helps), a small
# decoder that such data can fit, small batches and a higher rate so that an epoch of a few dozen steps moves,
# many epochs and a long patience (validation on a few dozen single-reference images is noisy).
BANDS = (
    Band(2_000, 1, (128, 256, 128), 32, 1e-3, 60, 10),
    Band(20_000, 2, (256, 512, 256), 64, 4e-4, 40, 8),
    Band(200_000, 5, (512, 512, 512), 64, 4e-4, 30, 5),  # Flickr8k (30k captions), Flickr30k: their recipes
    Band(float("inf"), 5, (512, 512, 512), 64, 4e-4, 20, 3),  # COCO (566k): coco-soft
)
# mean words per training caption -> lambda of the doubly stochastic regulariser (sum_t alpha_ti close to 1 at
# each of 196 places): a 3-word caption cannot spread its attention over the grid, and the term then outweighs
# the words (the paper's lambda 1 is for sentences of about 11 words)
LAMBDA_BY_LENGTH = ((5.0, 0.0), (8.0, 0.5), (float("inf"), 1.0))


@dataclass(frozen=True)
class DataShape:
    """What the settings are chosen from: the training split's images, captions and mean caption length, and
    the plug-in the data names (the synthetic scenes: their recipes hold their settings)."""
    images: int
    captions: int
    mean_words: float
    plugin: str | None = None


def data_shape(json_path: str | Path) -> DataShape:
    """Count the training split (train and restval) of a Karpathy-format dataset JSON."""
    data = load_karpathy_json(json_path, whole=True)
    records = [r for r in data["images"] if r["split"] in SPLIT_ALIASES["train"]]
    lengths = [len(s["tokens"]) for r in records for s in r["sentences"]]
    return DataShape(len(records), len(lengths), sum(lengths) / len(lengths) if lengths else 0.0,
                     dataset_plugin(data))


def band_for(captions: int) -> Band:
    return next(b for b in BANDS if captions < b.below)


def lambda_for(mean_words: float) -> float:
    return next(lam for below, lam in LAMBDA_BY_LENGTH if mean_words < below)


def auto_settings(shape: DataShape) -> dict[str, dict]:
    """The settings for data of this shape, nested like a recipe."""
    b = band_for(shape.captions)
    embed, hidden, attention = b.dims
    return {"data": {"min_word_count": b.min_word_count},
            "model": {"embed_dim": embed, "hidden_dim": hidden, "attention_dim": attention},
            "optim": {"batch_size": b.batch_size, "lr": b.lr, "epochs": b.epochs,
                      "lambda_ds": lambda_for(shape.mean_words)},
            "eval": {"patience": b.patience}}


def describe(shape: DataShape, settings: dict[str, dict]) -> str:
    """One line: what was counted and what it chose (printed at the start, and atop train_config.toml)."""
    chosen = ", ".join(f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}"
                       for section in settings.values() for key, value in section.items())
    return (f"settings from the data ({shape.images} training images, {shape.captions} captions, "
            f"{shape.mean_words:.1f} words each on average; no recipe names this dataset): {chosen}")
