"""The shipped checkpoints still meet their model cards: regenerate the test split, caption it, re-score it."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CARDS = sorted((ROOT / "checkpoints").glob("*/card.json"))
CHECKED = ("BLEU-4", "CIDEr-D", "ROUGE-L", "object_f1", "attention_correctness")

# Regenerates the 1,000-scene test split and captions it with every shipped checkpoint: the integration tier.
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def test_split(tmp_path_factory):
    from captioner.data.karpathy import KarpathySplit
    from captioner.scenes.shapes import DEFAULT_SPLITS, generate

    out = tmp_path_factory.mktemp("shapes-test")
    generate(out, seed=0, splits={"test": DEFAULT_SPLITS["test"]}, workers=2, progress=False)
    return KarpathySplit.load(out / "dataset_shapes.json", "test")


def test_there_are_shipped_checkpoints():
    assert {p.parent.name for p in CARDS} >= {"shapes-soft"}


@pytest.mark.parametrize("card_path", CARDS, ids=[p.parent.name for p in CARDS])
def test_checkpoint_meets_its_card(card_path, test_split):
    import captioner
    from captioner.data.karpathy import ImageFileLoader
    from captioner.evaluation.evaluate import evaluate_split

    card = json.loads(card_path.read_text())["results"]["test"]
    model = captioner.load(card_path.parent)
    loader = ImageFileLoader(test_split.image_paths, model.preprocessing.transform())
    metrics, _ = evaluate_split(model, test_split, loader, model.decoding.updated(beam_size=card["beam_size"]),
                                meteor=False, progress=False, batch_size=50)
    for key in CHECKED:
        assert metrics[key] == pytest.approx(card[key], abs=0.01), key
    assert metrics["attention_ratio"] >= 3.0
