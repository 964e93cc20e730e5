"""The Show-Attend-Tell model: shapes, gradient flow, the doubly stochastic regulariser, gate, deep output, masking."""

import pytest
import torch
from torch import nn

from captioner.model.config import ModelConfig
from captioner.model.decoder import Decoder, DecoderOutput
from tests.flat_configs import configs
from captioner.training.losses import caption_loss, doubly_stochastic
from captioner.model.captioner import Captioner
from captioner.vocab import Vocabulary

VOCAB = Vocabulary(["a", "red", "blue", "circle", "square", "two", "small", "and"])
C, GRID = 8, 3  # annotation channels and grid side for decoder-only tests (L = 9)


def tiny_cfg(**overrides) -> ModelConfig:
    base = dict(encoder="small_cnn", encoder_weights=None, grid=GRID, encoder_channels=C, hidden_dim=32, embed_dim=16,
                attention_dim=16, dropout=0.0, vocab_size=len(VOCAB))
    return configs(**{**base, **overrides})[0]


def captions_batch(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded captions (B, T+1) starting with <start>, ending with <end>; ``lengths`` count both markers."""
    g = torch.Generator().manual_seed(seed)
    caps = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, n in enumerate(lengths):
        words = torch.randint(4, len(VOCAB), (n - 2,), generator=g)
        caps[row, :n] = torch.cat([torch.tensor([VOCAB.start_index]), words, torch.tensor([VOCAB.end_index])])
    return caps, torch.tensor(lengths)


def test_captioner_forward_shapes_and_finite():
    model = Captioner(ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=32, embed_dim=16,
                                  attention_dim=16), VOCAB, encoder_weights=None)
    images = torch.randn(2, 3, 64, 64)
    captions, lengths = captions_batch([6, 4])
    out = model(images, captions, lengths)
    L = model.encode(images).shape[1]
    assert L == 4 * 4  # four stride-2 blocks: 64 px -> 4x4
    assert out.logits.shape == (2, 5, len(VOCAB))
    assert out.alphas.shape == (2, 5, L)
    assert out.mask.tolist() == [[True] * 5, [True] * 3 + [False] * 2]
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.alphas).all()
    assert torch.allclose(out.alphas[0].sum(-1), torch.ones(5), atol=1e-5)
    assert (out.alphas[1, 3:] == 0).all()  # zero past the caption's end


@pytest.mark.parametrize("options", [
    dict(),  # soft attention, deep output and gate (the paper's model)
    dict(channel_attention=True),
    dict(self_attention=True),
    dict(value_projection=True, score="cosine"),
    dict(gate=False, deep_output=False),
    dict(location=True),  # location-aware attention: the history conv learns
    dict(location=True, score="general"),
    dict(word_query=True),  # the query also reads E y_{t-1}
    dict(word_query=True, channel_attention=True, score="scaled_dot"),
    dict(lookalike=2, positional=4, location=True, score="scaled_dot"),  # the look-alike projection learns
    dict(lookalike=2, self_attention=True),
])
def test_gradients_reach_every_parameter(options):
    torch.manual_seed(0)
    decoder = Decoder.build(tiny_cfg(**options)).train()
    annotations = torch.randn(3, GRID * GRID, C, requires_grad=True)
    captions, lengths = captions_batch([7, 5, 3])
    out = decoder(annotations, captions, lengths)
    loss, _ = caption_loss(out, captions[:, 1:], lambda_ds=1.0)
    loss.backward()
    dead = [name for name, p in decoder.named_parameters() if p.requires_grad
            and (p.grad is None or not torch.isfinite(p.grad).all() or p.grad.abs().sum() == 0)]
    assert not dead, f"no gradient reaches {dead}"
    assert annotations.grad is not None and annotations.grad.abs().sum() > 0


def test_gradients_reach_the_trainable_encoder():
    model = Captioner(ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=32, embed_dim=16,
                                  attention_dim=16), VOCAB, encoder_weights=None).train()
    captions, lengths = captions_batch([5, 4])
    loss, _ = caption_loss(model(torch.randn(2, 3, 64, 64), captions, lengths), captions[:, 1:])
    loss.backward()
    dead = [n for n, p in model.encoder.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)]
    assert not dead and any(p.requires_grad for p in model.encoder.parameters())


def test_doubly_stochastic_hand_computed():
    alphas = torch.tensor([[[0.5, 0.5], [1.0, 0.0]],
                           [[0.2, 0.8], [0.3, 0.7]]])  # (B=2, T=2, L=2)
    mask = torch.tensor([[True, True], [True, False]])  # the second caption has one word: its step 2 is ignored
    # caption 1: sums over t (1.5, 0.5) -> 0.25 + 0.25 = 0.5; caption 2: (0.2, 0.8) -> 0.64 + 0.04 = 0.68
    assert float(doubly_stochastic(alphas, mask)) == pytest.approx((0.5 + 0.68) / 2)

    logits = torch.randn(2, 2, 5)
    targets = torch.tensor([[1, 2], [3, 0]])
    out = DecoderOutput(logits, alphas, mask)
    loss0, parts0 = caption_loss(out, targets, lambda_ds=0.0)
    loss2, parts2 = caption_loss(out, targets, lambda_ds=2.0)
    assert "ds" not in parts0 and parts2["ds"] == pytest.approx(0.59)
    assert float(loss2 - loss0) == pytest.approx(2 * 0.59, abs=1e-6)
    # the cross-entropy is the mean over the three real words only
    nll = -logits.log_softmax(-1)
    assert parts0["ce"] == pytest.approx(float((nll[0, 0, 1] + nll[0, 1, 2] + nll[1, 0, 3]) / 3), abs=1e-6)


def _lstm_inputs(decoder: Decoder, annotations, captions, lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the decoder and return (logits, the LSTM inputs of its first step)."""
    seen = []
    handle = decoder.lstm.register_forward_hook(lambda m, inp, out: seen.append(inp[0].detach().clone()))
    try:
        out = decoder(annotations, captions, lengths)
    finally:
        handle.remove()
    return out.logits, seen[0]


def test_beta_gate_scales_the_context():
    torch.manual_seed(0)
    decoder = Decoder(tiny_cfg()).eval()
    assert isinstance(decoder.f_beta, nn.Linear)
    annotations = torch.randn(2, GRID * GRID, C)
    captions, lengths = captions_batch([5, 5])
    logits_open, inputs_open = _lstm_inputs(decoder, annotations, captions, lengths)
    z_open = inputs_open[:, 16:]  # the context part of [E y; z]
    with torch.no_grad():
        decoder.f_beta.weight.zero_()
        decoder.f_beta.bias.fill_(-1e4)  # beta = sigmoid(-1e4) = 0: the gate shuts
    logits_shut, inputs_shut = _lstm_inputs(decoder, annotations, captions, lengths)
    assert z_open.abs().sum() > 0 and (inputs_shut[:, 16:] == 0).all()
    assert torch.equal(inputs_open[:, :16], inputs_shut[:, :16])  # the word embedding part is untouched
    assert not torch.allclose(logits_open, logits_shut)
    with torch.no_grad():
        decoder.f_beta.bias.fill_(0.0)  # beta = 0.5 exactly
    _, inputs_half = _lstm_inputs(decoder, annotations, captions, lengths)
    decoder.f_beta = None  # no gate at all: beta = 1
    _, inputs_ungated = _lstm_inputs(decoder, annotations, captions, lengths)
    assert torch.allclose(inputs_half[:, 16:], 0.5 * inputs_ungated[:, 16:], atol=1e-6)


def test_deep_output_is_used():
    torch.manual_seed(0)
    decoder = Decoder(tiny_cfg()).eval()
    assert {"L_h", "L_z", "L_o"} <= {n for n, _ in decoder.named_children()} and not hasattr(decoder, "fc")
    calls = {"L_h": 0, "L_z": 0, "L_o": 0}
    for name in calls:
        getattr(decoder, name).register_forward_hook(lambda m, i, o, name=name: calls.__setitem__(name, calls[name] + 1))
    annotations = torch.randn(2, GRID * GRID, C)
    captions, lengths = captions_batch([6, 6])
    before = decoder(annotations, captions, lengths).logits
    assert calls == {"L_h": 5, "L_z": 5, "L_o": 5}  # once per step
    with torch.no_grad():
        decoder.L_z.weight.zero_()
        decoder.L_z.bias.zero_()
    assert not torch.allclose(before, decoder(annotations, captions, lengths).logits)  # z reaches the output
    plain = Decoder(tiny_cfg(deep_output=False))
    assert isinstance(plain.fc, nn.Linear) and not hasattr(plain, "L_o")


def test_padding_is_masked():
    """A padded batch gives each caption the same outputs and loss as the caption run alone."""
    torch.manual_seed(0)
    decoder = Decoder(tiny_cfg()).eval()
    annotations = torch.randn(3, GRID * GRID, C)
    captions, lengths = captions_batch([4, 8, 6], seed=1)
    out = decoder(annotations, captions, lengths)
    loss, parts = caption_loss(out, captions[:, 1:], lambda_ds=1.0)

    ce_sum, ds = 0.0, []
    for b, n in enumerate(lengths.tolist()):
        alone = decoder(annotations[b:b + 1], captions[b:b + 1, :n], lengths[b:b + 1])
        assert torch.allclose(alone.logits[0], out.logits[b, : n - 1], atol=1e-5)
        assert torch.allclose(alone.alphas[0], out.alphas[b, : n - 1], atol=1e-6)
        _, p = caption_loss(alone, captions[b:b + 1, 1:n], lambda_ds=1.0)
        ce_sum += p["ce"] * (n - 1)
        ds.append(p["ds"])
    assert parts["ce"] == pytest.approx(ce_sum / float((lengths - 1).sum()), rel=1e-5)
    assert parts["ds"] == pytest.approx(sum(ds) / len(ds), rel=1e-5)

    garbage = captions.clone()  # what sits in the padding must not matter
    for b, n in enumerate(lengths.tolist()):
        garbage[b, n:] = 5
    loss_garbage, _ = caption_loss(decoder(annotations, garbage, lengths), garbage[:, 1:], lambda_ds=1.0)
    assert float(loss_garbage.detach()) == pytest.approx(float(loss.detach()), rel=1e-6)


def test_no_attention_baseline_uses_uniform_weights():
    decoder = Decoder(tiny_cfg(attention="none"))
    captions, lengths = captions_batch([5, 3])
    out = decoder(torch.randn(2, GRID * GRID, C), captions, lengths)
    assert torch.allclose(out.alphas[0], torch.full((4, GRID * GRID), 1 / GRID ** 2))


def test_positional_channels_locate_every_cell():
    from captioner.model.decoder import grid_positions

    pos = grid_positions(7, 16)  # (49, 16)
    assert pos.shape == (49, 16)
    assert torch.cdist(pos, pos).add(torch.eye(49) * 10).min() > 1e-3  # every location has its own code


def test_multiscale_encoder_concatenates_stages():
    from captioner.encoders import build_encoder

    enc = build_encoder("efficientnet_lite0_ms", weights=None).eval()
    out = enc(torch.randn(1, 3, 224, 224))
    assert out.shape == (1, 196, 232) and enc.channels == 232 and enc.grid_size(224) == (14, 14)


@pytest.mark.parametrize("word_query", [False, True])
def test_word_query_lets_the_emitted_word_steer_attention(word_query):
    """With word_query, alpha_t depends on y_{t-1} (the word just emitted); without it, only on h_{t-1}."""
    torch.manual_seed(0)
    decoder = Decoder(tiny_cfg(word_query=word_query)).eval()
    state = decoder.init_state(torch.randn(1, GRID * GRID, C))
    _, _, alpha_a, _ = decoder.step(torch.tensor([VOCAB.stoi["red"]]), state)
    _, _, alpha_b, _ = decoder.step(torch.tensor([VOCAB.stoi["blue"]]), state)
    assert torch.allclose(alpha_a.sum(-1), torch.ones(1)) and torch.allclose(alpha_b.sum(-1), torch.ones(1))
    assert torch.allclose(alpha_a, alpha_b) != word_query


@pytest.mark.parametrize("beam_size", [1, 3], ids=["greedy", "beam"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_scores_are_an_error_that_says_so(beam_size, bad):
    """NaN word scores made greedy decoding return "" and beam search fail with IndexError: now one error line."""
    from captioner.decoding.search import NonFiniteScoresError, beam_search, greedy_decode
    from captioner.errors import CaptionerError

    torch.manual_seed(0)
    decoder = Decoder(tiny_cfg()).eval()
    with torch.no_grad():
        decoder.L_o.weight[5, 0] = bad
    annotations = torch.randn(2, GRID * GRID, C).abs()  # (B, L, C)
    with pytest.raises(NonFiniteScoresError) as excinfo:
        if beam_size == 1:
            greedy_decode(decoder, annotations, VOCAB.start_index, VOCAB.end_index, 5)
        else:
            beam_search(decoder, annotations, VOCAB.start_index, VOCAB.end_index, beam_size, 5)
    assert isinstance(excinfo.value, CaptionerError) and "NaN" in str(excinfo.value)


def test_config_validate_accepts_every_option():
    """validate() refuses hostile values (tests/test_checkpoint_trust.py) but every real option passes."""
    from captioner.model.attention import SCORES

    for score in SCORES:
        for attention in ("soft", "hard"):
            tiny_cfg(score=score, attention=attention, location=True, word_query=True, positional=8, lookalike=4,
                     self_attention=True, channel_attention=True, value_projection=True,
                     hard_inference="argmax", fine_tune_from=2, dropout=0.0).validate()
    tiny_cfg(attention="none", gate=False, deep_output=False).validate()
    for encoder in ("efficientnet_lite0", "efficientnet_lite0_ms", "resnet50", "resnet101", "vgg19", "small_cnn"):
        ModelConfig(encoder=encoder, vocab_size=10_000, hidden_dim=1800, embed_dim=512, encoder_channels=2048)\
            .validate()  # the paper's COCO decoder with a ResNet's 2048 channels


@pytest.mark.parametrize("name", ["efficientnet_lite0", "efficientnet_lite0_ms", "small_cnn", "resnet50"])
def test_encoder_specs_know_their_channels_and_grids(name):
    """checkpoint.load checks encoder_channels against the registry before building: the registry must be right."""
    from captioner.encoders import ENCODERS, build_encoder

    spec = ENCODERS[name]
    for grid in spec.grids or (14, 5):
        assert build_encoder(name, weights=None, grid=grid).channels == spec.channels_at(grid)
