"""Supervised attention: targets from object boxes, their batching, and the loss term."""

import numpy as np
import pytest
import torch

from captioner.model.config import ModelConfig
from captioner.data.grounding import box_coverage, object_targets, sentence_targets
from captioner.data.karpathy import CaptionDataset, KarpathySplit, collate_captions
from captioner.model.decoder import Decoder
from captioner.training.losses import attention_supervision, caption_loss
from captioner.vocab import Vocabulary


def test_box_coverage_counts_pixels_per_cell():
    # a 4x4-pixel image on a 2x2 grid: each cell is 2x2 pixels
    cover = box_coverage([1, 0, 4, 2], (2, 2), (4, 4))
    np.testing.assert_allclose(cover, [[2.0, 4.0], [0.0, 0.0]])
    wide = box_coverage([0, 0, 8, 4], (2, 4), (8, 4))  # a non-square image: W=8, H=4
    np.testing.assert_allclose(wide, np.full((2, 4), 4.0))


def test_object_targets_join_groups_and_sum_to_one():
    objects = [{"bbox": [0, 0, 2, 2], "group": 0}, {"bbox": [2, 2, 4, 4], "group": 1},
               {"bbox": [2, 0, 4, 2], "group": 0}]
    t = object_targets(objects, (2, 2), (4, 4))  # (3, 4)
    np.testing.assert_allclose(t.sum(1), 1.0)
    np.testing.assert_allclose(t[0], [0.5, 0.5, 0.0, 0.0])  # the two group-0 boxes, top row
    np.testing.assert_allclose(t[0], t[2])
    np.testing.assert_allclose(t[1], [0.0, 0.0, 0.0, 1.0])
    rows = sentence_targets([-1, 1, 1, -1, 0], t, max_len=4)
    assert rows.shape == (4, 4)
    assert rows[0].sum() == 0 and rows[3].sum() == 0
    np.testing.assert_allclose(rows[1], t[1])


def test_caption_dataset_targets_follow_refs(shapes_json):
    split = KarpathySplit.load(shapes_json, "train")
    vocab = Vocabulary.build(split.all_tokens(), min_count=1)
    ds = CaptionDataset(split, vocab, lambda i: torch.zeros(49, 8), max_len=30, attention_grid=(7, 7))
    _, ids, image_index, targets = ds[0]
    refs = split.records[image_index]["sentences"][0]["refs"]
    assert targets.shape == (len(ids) - 1, 49)  # one row per predicted word: the tokens, then <end>
    sums = targets.sum(1)
    expected = torch.tensor([1.0 if r >= 0 else 0.0 for r in refs] + [0.0])
    torch.testing.assert_close(sums, expected)
    # the mass lies in the cells under the named object's box (224-pixel image, 32-pixel cells)
    named = max(refs)
    x0, y0, x1, y1 = split.records[image_index]["objects"][named]["bbox"]
    t = refs.index(named)
    grid = targets[t].reshape(7, 7)
    inside = grid[y0 // 32: -(-y1 // 32), x0 // 32: -(-x1 // 32)].sum()
    assert inside >= 0.5  # its own box, maybe joined by the group's other boxes
    batch = collate_captions([ds[0], ds[1], ds[2]])
    assert batch["attention_targets"].shape == (3, batch["captions"].shape[1] - 1, 49)
    plain = CaptionDataset(split, vocab, lambda i: torch.zeros(49, 8), max_len=30)
    assert len(plain[0]) == 3 and "attention_targets" not in collate_captions([plain[0], plain[1]])


def test_supervision_value_on_a_hand_computed_case():
    alphas = torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]])  # (1, 2, 3)
    targets = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]])  # the second word names nothing
    mask = torch.tensor([[True, True]])
    value = attention_supervision(alphas, targets, mask)
    assert value.item() == pytest.approx(-(0.5 * np.log(0.5) + 0.5 * np.log(0.25)))
    masked = attention_supervision(alphas, targets, torch.tensor([[False, True]]))
    assert masked.item() == 0.0  # the only target lies past the caption's end


def test_mass_supervision_only_asks_for_alpha_inside_the_box():
    alphas = torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]])  # (1, 2, 3)
    targets = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]])
    mask = torch.tensor([[True, True]])
    assert attention_supervision(alphas, targets, mask, "mass").item() == pytest.approx(-np.log(0.75))
    peaked = torch.tensor([[[1.0, 0.0, 0.0], [0.1, 0.1, 0.8]]])  # all on one cell of the box
    assert attention_supervision(peaked, targets, mask, "mass").item() == pytest.approx(0.0, abs=1e-6)
    assert attention_supervision(peaked, targets, mask, "match").item() > 5.0  # match wants the whole box
    with pytest.raises(ValueError, match="mass"):
        attention_supervision(alphas, targets, mask, "nearby")


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_supervision_trains_the_attention_towards_the_box(attention):
    """A few steps on the supervised term alone move alpha onto the target cells, for soft and hard attention."""
    torch.manual_seed(0)
    cfg = ModelConfig(encoder="small_cnn", grid=3, encoder_channels=8, attention=attention, score="additive",
                      embed_dim=8, hidden_dim=16, attention_dim=8, vocab_size=10, dropout=0.0)
    decoder = Decoder(cfg)
    annotations = torch.randn(4, 9, 8)  # (B, L, C)
    captions = torch.randint(3, 10, (4, 5))
    lengths = torch.full((4,), 5)
    targets = torch.zeros(4, 4, 9)
    targets[:, :, 4] = 1.0  # every word should look at the centre cell
    optimizer = torch.optim.Adam(decoder.parameters(), lr=0.05)
    before = None
    for _ in range(40):
        out = decoder(annotations, captions, lengths)
        loss, parts = caption_loss(out, captions[:, 1:], lambda_ds=0.0, attention_targets=targets, lambda_att=1.0)
        supervised = attention_supervision(out.alphas, targets, out.mask)
        before = supervised.item() if before is None else before
        optimizer.zero_grad()
        supervised.backward()
        optimizer.step()
    assert "att" in parts
    assert supervised.item() < 0.5 * before
    assert out.alphas[..., 4].mean() > 0.5
