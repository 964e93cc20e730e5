"""The count mask: an unnormalised per-location "looks like the attended object" mask whose mass the count head
reads, supervised by the boxes of the object group each word names. (Batched = single beam search with the mask:
tests/test_count_head.py.)"""

from types import SimpleNamespace

import pytest
import torch

from captioner.model.config import ModelConfig
from captioner.model.decoder import Decoder
from captioner.errors import ConfigError
from tests.flat_configs import configs
from captioner.training.losses import caption_loss
from captioner.scenes.plugin import SceneModel, model_settings
from captioner.scenes.training import object_mask_loss, training_losses
from captioner.vocab import Vocabulary

VOCAB = Vocabulary(["a", "red", "circle", "two", "circles"])
CAPTIONS = torch.tensor([[1, 4, 5, 6, 2], [1, 7, 8, 2, 0], [1, 4, 2, 0, 0]])
LENGTHS = torch.tensor([5, 4, 3])


def cfg(**overrides) -> ModelConfig:
    base = dict(encoder="small_cnn", encoder_weights=None, grid=3, encoder_channels=8, hidden_dim=32, embed_dim=16,
                attention_dim=16, dropout=0.0, vocab_size=len(VOCAB), count_head=True, count_mask=True,
                location=True, word_query=True, score="scaled_dot")
    return configs(**{**base, **overrides})[0]


def box_targets() -> torch.Tensor:
    """(3, 4, 9) targets: the first word of every caption names an object on cells 0 and 1, the rest nothing."""
    targets = torch.zeros(3, 4, 9)
    targets[:, 0, :2] = 0.5
    return targets


def test_training_forward_returns_mask_logits_for_every_step():
    torch.manual_seed(0)
    dec = Decoder.build(cfg()).train()
    out = dec(torch.randn(3, 9, 8), CAPTIONS, LENGTHS)
    mask = out.extras.get("object_mask")
    assert mask is not None and mask.shape == (3, 4, 9)  # (B, T, L)
    assert "object_mask" not in Decoder.build(cfg()).eval()(torch.randn(3, 9, 8), CAPTIONS, LENGTHS).extras
    no_mask = Decoder.build(cfg(count_mask=False)).train()
    assert "object_mask" not in no_mask(torch.randn(3, 9, 8), CAPTIONS, LENGTHS).extras


def test_mask_logits_after_the_loop_equal_the_step_ones():
    """The loss scores the mask on all steps at once from alpha; the step computes it from its own z: same values."""
    torch.manual_seed(0)
    dec = Decoder.build(cfg(dropout=0.0)).train()
    ann = torch.randn(3, 9, 8)
    out = dec(ann, CAPTIONS, LENGTHS)
    state = dec.init_state(ann)
    for t in range(4):
        z, alpha, _ = dec.context(state, None, dec.embedding(CAPTIONS[:, t]))
        step_logits = dec.extension.object_mask_logits(state.annotations, z)  # (B, L)
        rows = LENGTHS - 1 > t
        assert torch.allclose(step_logits[rows], out.extras.get("object_mask")[rows, t], atol=1e-5)
        _, state, _, _ = dec.step(CAPTIONS[:, t], state)


def test_gradients_reach_every_parameter_from_caption_and_mask_losses():
    torch.manual_seed(0)
    dec = Decoder.build(cfg()).train()
    out = dec(torch.randn(3, 9, 8), CAPTIONS, LENGTHS)
    loss, _ = caption_loss(out, CAPTIONS[:, 1:], lambda_ds=0.0, attention_targets=box_targets(), lambda_att=1.0)
    # the count mask's supervision: the scenes plug-in's loss, which the training loop adds
    extra = training_losses(dec, out, {}, box_targets(), SimpleNamespace(lambda_mask=1.0, lambda_twin=0.0), "cpu")
    assert set(extra) == {"mask"} and extra["mask"][0] == 1.0
    loss = loss + sum(weight * value for weight, value in extra.values())
    loss.backward()
    for name, p in dec.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert dec.extension.count_head[0].weight.grad[:, -1].abs().sum() > 0  # the mass feature is read


def test_mask_loss_only_on_words_with_a_target_and_it_learns_the_boxes():
    torch.manual_seed(0)
    logits = torch.zeros(3, 4, 9, requires_grad=True)
    mask = torch.ones(3, 4, dtype=torch.bool)
    assert object_mask_loss(logits, torch.zeros(3, 4, 9), mask).item() == 0.0  # nothing named: no loss
    dec = Decoder.build(cfg()).train()
    ann = torch.randn(3, 9, 8)
    optimiser = torch.optim.Adam(dec.parameters(), lr=1e-2)
    first = None
    for _ in range(150):
        out = dec(ann, CAPTIONS, LENGTHS)
        loss = object_mask_loss(out.extras.get("object_mask"), box_targets(), out.mask)
        first = float(loss.detach()) if first is None else first
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    assert float(loss.detach()) < 0.5 * first
    inside = torch.sigmoid(out.extras.get("object_mask")[:, 0])  # (B, L) the naming word's mask
    assert bool((inside[:, :2].mean(1) > inside[:, 2:].mean(1) + 0.2).all())  # the box's cells stand out


def test_needs_the_count_head_and_round_trips():
    with pytest.raises(ConfigError, match="count_mask"):
        cfg(count_head=False).validate()
    assert SceneModel().count_mask is False
    assert ModelConfig.from_dict(cfg().to_dict()).plugin_config["count_mask"] is True
    legacy = cfg().to_dict()
    legacy["plugin_config"].pop("count_mask")  # checkpoints written before the setting existed
    old = ModelConfig.from_dict(legacy)
    assert model_settings(old.plugin_config).count_mask is False
    assert Decoder.build(old).extension.count_mask is None
