"""The count head: the word predictor sees how widely alpha is spread, so one object and two can be told apart."""

import math

import pytest
import torch

from captioner.decoding.search import beam_search, greedy_decode
from captioner.model.config import ModelConfig
from captioner.model.decoder import Decoder
from captioner.errors import ConfigError
from tests.flat_configs import configs
from captioner.scenes.extension import attention_spread
from captioner.scenes.plugin import SceneModel
from captioner.vocab import Vocabulary

VOCAB = Vocabulary(["a", "red", "circle", "two", "circles"])


def cfg(**overrides) -> ModelConfig:
    base = dict(encoder="small_cnn", encoder_weights=None, grid=3, encoder_channels=8, hidden_dim=32, embed_dim=16,
                attention_dim=16, dropout=0.0, vocab_size=len(VOCAB), count_head=True)
    return configs(**{**base, **overrides})[0]


def test_spread_counts_covered_locations():
    one = torch.tensor([[0.5, 0.5, 0.0, 0.0]])  # one object over two cells
    two = torch.tensor([[0.25, 0.25, 0.25, 0.25]])  # two such objects
    assert attention_spread(one)[0].tolist() == pytest.approx([math.log(2), math.log(2)], abs=1e-5)
    assert attention_spread(two)[0].tolist() == pytest.approx([math.log(4), math.log(4)], abs=1e-5)
    peaked = torch.tensor([[0.7, 0.1, 0.1, 0.1]])
    assert attention_spread(peaked)[0, 1] == pytest.approx(-math.log(0.7), abs=1e-5)


def test_gradients_reach_the_count_head_and_the_attention_through_it():
    torch.manual_seed(0)
    dec = Decoder.build(cfg(location=True, word_query=True, score="scaled_dot"))
    annotations = torch.randn(3, 9, 8)
    captions = torch.tensor([[1, 4, 5, 6, 2], [1, 7, 8, 2, 0], [1, 4, 2, 0, 0]])
    out = dec(annotations, captions, torch.tensor([5, 4, 3]))
    out.logits.sum().backward()
    for name, p in dec.named_parameters():
        if name.startswith("self_attention") or name.startswith("channel"):
            continue
        if name == "attention.score.location.bias":
            # with a dot-product score the location term has one channel, so its bias adds the same number to every
            # location's score and the softmax ignores it: its gradient is 0 up to rounding (exactly 0 on some CPUs)
            assert dec.attention.score.location.out_channels == 1 and p.grad.abs().max() < 1e-6, name
            continue
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # the head reads alpha: with the rest of the logits path frozen, its input still moves the attention's score
    w = dec.extension.count_head[0].weight
    assert w.grad[:, -2:].abs().sum() > 0  # the two spread features have gradient


def test_head_changes_word_scores_with_spread_only():
    """Same context, different spread -> different logits: the head sees what the average hides."""
    torch.manual_seed(0)
    dec = Decoder.build(cfg()).eval()
    z = torch.zeros(1, 8)
    one = dec.extension.count_head(torch.cat([z, attention_spread(torch.tensor([[0.5, 0.5] + [0.0] * 7]))], -1))
    two = dec.extension.count_head(torch.cat([z, attention_spread(torch.full((1, 9), 1 / 9))], -1))
    assert not torch.allclose(one, two)


@pytest.mark.parametrize("extra", [{}, dict(count_mask=True, word_query=True, score="scaled_dot")],
                         ids=["head", "head+mask"])
def test_decoding_runs_and_batched_equals_single(extra):
    torch.manual_seed(0)
    dec = Decoder.build(cfg(location=True, **extra)).eval()
    ann = torch.randn(4, 9, 8)
    batched = beam_search(dec, ann, VOCAB.start_index, VOCAB.end_index, beam_size=3, max_len=6)
    for i in range(4):
        single = beam_search(dec, ann[i:i + 1], VOCAB.start_index, VOCAB.end_index, beam_size=3, max_len=6)[0]
        assert single.words == batched[i].words
        assert single.log_prob == pytest.approx(batched[i].log_prob, abs=1e-5)
    assert len(greedy_decode(dec, ann, VOCAB.start_index, VOCAB.end_index, max_len=6)) == 4


@pytest.mark.parametrize("bad", [dict(attention="none"), dict(deep_output=False)])
def test_needs_attention_and_deep_output(bad):
    with pytest.raises(ConfigError, match="count_head"):
        cfg(**bad).validate()


def test_config_round_trip_and_default_off():
    assert SceneModel().count_head is False
    assert ModelConfig.from_dict(cfg().to_dict()).plugin_config["count_head"] is True
