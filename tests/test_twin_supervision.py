"""Look-alike supervision (--lambda-twin): the cell labels from object boxes, the pair loss, its batching
and a training run that uses it."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from captioner.scenes.grounding import AMBIGUOUS, BACKGROUND, cell_labels, cell_objects
from captioner.data.karpathy import CaptionDataset, KarpathySplit, collate_captions
from captioner.training.config import SettingError, TrainConfig
from captioner.scenes.lookalike import LookAlike
from captioner.scenes.training import twin_loss
from captioner.vocab import Vocabulary

ROOT = Path(__file__).resolve().parents[1]
GRID, C = 8, 12


def test_cell_labels_name_the_object_covering_most_of_each_cell():
    # an 8x8-pixel image on a 4x4 grid (2x2-pixel cells): object 0 fills the top-left cell, object 1 (same group)
    # the bottom-right one, object 2 (another group) a quarter of cell (0, 2)
    objects = [{"bbox": [0, 0, 2, 2], "group": 0}, {"bbox": [6, 6, 8, 8], "group": 0},
               {"bbox": [4, 0, 5, 1], "group": 1}]
    group, obj = cell_objects(objects, (4, 4), (8, 8))  # (16,) each
    assert (group[0], obj[0]) == (0, 0) and (group[15], obj[15]) == (0, 1)
    assert group[2] == AMBIGUOUS and obj[2] == AMBIGUOUS  # partly covered: neither object nor background
    assert cell_objects(objects, (4, 4), (8, 8), min_share=0.25)[0][2] == 1
    assert (group[[1, 3, 4, 5, 14]] == BACKGROUND).all()
    assert (cell_objects([], (4, 4), (8, 8)) == BACKGROUND).all()
    # the data loader's function: the same labels as a tensor, all background for an image without objects
    labels = cell_labels(objects, (4, 4), (8, 8))
    assert labels.dtype == torch.long and labels.shape == (2, 16)
    np.testing.assert_array_equal(labels.numpy(), cell_objects(objects, (4, 4), (8, 8)))
    for none in (None, []):
        empty = cell_labels(none, (4, 4), (0, 0))
        assert empty.shape == (2, 16) and (empty == BACKGROUND).all()


def scene(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two identical objects (the same feature vector) in two far corners and a look-alike of another group (the
    same vector, partly changed) in the third; every other cell random. Returns annotations (1, L, C) and cell
    labels (1, 2, L)."""
    g = torch.Generator().manual_seed(seed)
    grid = torch.randn(1, GRID * GRID, C, generator=g)
    thing = torch.randn(C, generator=g) * 2
    other = thing.clone()
    other[: C // 2] = torch.randn(C // 2, generator=g) * 2
    cells = torch.full((1, 2, GRID * GRID), BACKGROUND, dtype=torch.long)
    for obj, (cell, vec, group) in enumerate([(0, thing, 0), (GRID * GRID - 1, thing, 0), (GRID - 1, other, 1)]):
        grid[0, cell] = vec
        cells[0, :, cell] = torch.tensor([group, obj])
    return grid, cells


@pytest.mark.integration
def test_the_loss_teaches_the_channels_that_only_identical_copies_are_alike():
    torch.manual_seed(0)
    heads = LookAlike(C, heads=2, grid=GRID)
    opt = torch.optim.Adam(heads.parameters(), lr=0.05)
    first = None
    for step in range(300):  # the one hard negative of each scene weighs little beside the easy background
        a, cells = scene(step % 32)
        loss = twin_loss(heads, a, cells)
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.5 * first
    a, cells = scene(100)  # a scene it never saw
    with torch.no_grad():
        query, key = heads.query_key(a)
        scores = torch.bmm(query, key.transpose(1, 2)).view(2, GRID * GRID, GRID * GRID)  # (K, L, L)
    last = GRID * GRID - 1
    assert (scores[:, 0, last] > 0).all()  # the twin: alike
    assert (scores[:, 0, GRID - 1] < 0).all()  # shares half its features, another group: not alike
    assert (scores[:, 0, 1:GRID - 1] < 0).all()  # background (near cells are left out of the loss, not scored)


def test_the_loss_reaches_every_parameter_and_skips_what_it_cannot_score():
    torch.manual_seed(0)
    heads = LookAlike(C, heads=3, grid=GRID)
    a, cells = scene()
    twin_loss(heads, a, cells).backward()
    for name, p in heads.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    empty = torch.full_like(cells, BACKGROUND)  # no object cells: nothing to supervise, a zero that keeps the graph
    value = twin_loss(heads, a, empty)
    assert value.item() == 0.0 and value.requires_grad
    # ambiguous columns are left out: labelling the twin's cell ambiguous removes the only positive pair
    hidden = cells.clone()
    hidden[0, :, GRID * GRID - 1] = AMBIGUOUS
    assert twin_loss(heads, a, hidden).item() != pytest.approx(twin_loss(heads, a, cells).item())


def test_batches_carry_one_label_row_per_image(shapes_json):
    split = KarpathySplit.load(shapes_json, "train")
    vocab = Vocabulary.build(split.all_tokens(), min_count=1)
    ds = CaptionDataset(split, vocab, lambda i: torch.zeros(49, 8), max_len=30, attention_grid=(7, 7),
                        cell_labels=cell_labels)
    items = [ds[k] for k in range(len(ds))][:7]  # several captions of the first images
    batch = collate_captions(items)
    n = batch["inputs"].shape[0]
    assert batch["cell_labels"].shape == (n, 2, 49) and batch["cell_labels"].dtype == torch.long
    for row, k in enumerate(batch["image_of"].tolist()):
        image = batch["image_index"][row].item()
        record = split.records[image]
        expected = cell_objects(record["objects"], (7, 7), (224, 224))
        np.testing.assert_array_equal(batch["cell_labels"][k].numpy(), expected)
    assert len(CaptionDataset(split, vocab, lambda i: torch.zeros(1), attention_grid=(7, 7))[0]) == 4
    with pytest.raises(ValueError, match="attention_grid"):
        CaptionDataset(split, vocab, lambda i: torch.zeros(1), cell_labels=cell_labels)


def test_the_setting_needs_lookalike_channels():
    cfg = TrainConfig.from_recipe("shapes-soft")
    cfg.plugin["lambda_twin"] = 1.0
    cfg.validate()
    cfg.model.plugin_config = {**cfg.model.plugin_config, "lookalike": 0}
    with pytest.raises(SettingError, match="--lambda-twin needs --lookalike"):
        cfg.validate()


@pytest.mark.integration
def test_a_run_with_the_supervision_logs_it_in_cross_entropy_epochs_only(shapes_json, tmp_path):
    run = tmp_path / "twin"
    tiny = ["--encoder", "small_cnn", "--encoder-weights", "none", "--grid", "7", "--hidden-dim", "32",
            "--embed-dim", "16", "--attention-dim", "16", "--batch-size", "16", "--max-train-images", "3",
            "--max-val-images", "2", "--max-caption-len", "8", "--min-word-count", "1", "--cache", "off",
            "--no-progress", "--threads", "2", "--domain-images", "0", "--test-splits", ""]
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), *tiny, "--dataset", str(shapes_json),
                             "--out", str(run), "--epochs", "2", "--lookalike", "2", "--lambda-twin", "1",
                             "--scst-from", "2", "--scst-samples", "2"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert rows[0]["train"]["twin"] > 0 and "twin" not in rows[1]["train"]
    saved = TrainConfig.from_recipe(run / "train_config.toml")
    assert saved.plugin["lambda_twin"] == 1.0


def test_the_probe_tells_a_partial_look_alike_from_none():
    from experiments.lookalike_probe import partial_lookalike

    red_circle = {"shape": "circle", "color": "red", "group": 0}
    scene_objects = [red_circle, {"shape": "circle", "color": "blue", "group": 1},
                     {"shape": "star", "color": "green", "group": 2}]
    assert partial_lookalike(red_circle, scene_objects)  # the blue circle shares its shape
    assert not partial_lookalike(scene_objects[2], scene_objects)
    twin = {"shape": "circle", "color": "red", "group": 0}
    assert not partial_lookalike(red_circle, [red_circle, twin])  # an identical copy is a twin, not a partial one
