"""Hard (stochastic) attention trained with REINFORCE (Xu et al. 2015, sec. 4.1)."""

import pytest
import torch

from captioner.model.config import ModelConfig
from captioner.model.decoder import Decoder, DecoderOutput
from captioner.training.losses import HardAttentionObjective, caption_loss
from captioner.vocab import Vocabulary

VOCAB = Vocabulary(["a", "red", "blue", "circle", "square", "two", "small", "and"])
C, L = 8, 9


def hard_decoder(sample_prob: float = 1.0, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    cfg = ModelConfig(encoder="small_cnn", encoder_weights=None, grid=3, encoder_channels=C, hidden_dim=32,
                      embed_dim=16, attention_dim=16, dropout=0.0, vocab_size=len(VOCAB), attention="hard")
    decoder = Decoder(cfg).train()
    decoder.attention.sample_prob = sample_prob  # 1.0: every batch takes the sampled-location path
    return decoder


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four images (B, L, C) with one caption each (B, T+1), lengths (B,)."""
    sentences = ["a red circle", "two small blue squares", "a small red square and a blue circle", "red"]
    ids = [VOCAB.encode(s.split()) for s in sentences]
    captions = torch.zeros(len(ids), max(map(len, ids)), dtype=torch.long)
    for row, x in enumerate(ids):
        captions[row, : len(x)] = torch.tensor(x)
    annotations = torch.randn(len(ids), L, C, generator=torch.Generator().manual_seed(1))
    return annotations, captions, torch.tensor([len(x) for x in ids])


def attention_grad(decoder: Decoder) -> float:
    return sum(float(p.grad.abs().sum()) for p in decoder.attention.parameters() if p.grad is not None)


def test_reinforce_gives_attention_gradients_through_the_sample():
    decoder = hard_decoder(sample_prob=1.0)
    annotations, captions, lengths = batch()
    out = decoder(annotations, captions, lengths)
    assert out.sample_log_probs is not None and out.entropy is not None
    assert (out.sample_log_probs[out.mask] < 0).all() and (out.sample_log_probs[~out.mask] == 0).all()
    # The sampled context is values[index]: without REINFORCE (and with no other attention term) the attention
    # parameters get nothing; with it, they do.
    loss, parts = caption_loss(out, captions[:, 1:], lambda_ds=0.0,
                               hard=HardAttentionObjective(entropy_weight=0.0, reinforce_weight=0.0))
    loss.backward()
    assert attention_grad(decoder) == 0.0
    decoder.zero_grad()
    out = decoder(annotations, captions, lengths)
    loss, parts = caption_loss(out, captions[:, 1:], lambda_ds=0.0, hard=HardAttentionObjective(entropy_weight=0.0))
    loss.backward()
    assert "reinforce" in parts and attention_grad(decoder) > 0
    assert all(p.grad is not None for p in decoder.attention.parameters())


def test_expected_context_batches_leave_reinforce_and_baseline_alone():
    decoder = hard_decoder(sample_prob=0.0)  # every batch takes the expected context
    annotations, captions, lengths = batch()
    out = decoder(annotations, captions, lengths)
    assert out.sample_log_probs is None and out.entropy is not None
    hard = HardAttentionObjective()
    _, parts = caption_loss(out, captions[:, 1:], lambda_ds=1.0, hard=hard)
    assert "reinforce" not in parts and hard.baseline is None


def test_baseline_moving_average():
    hard = HardAttentionObjective(decay=0.9)
    x1, x2, x3 = torch.tensor([-4.0, -2.0]), torch.tensor([-1.0, -1.0]), torch.tensor([0.0, -10.0])
    assert hard.update_baseline(x1) == pytest.approx(-3.0)  # b1 = x1
    assert hard.update_baseline(x2) == pytest.approx(0.9 * -3.0 + 0.1 * -1.0)  # b2 = 0.9 b1 + 0.1 x2
    assert hard.update_baseline(x3) == pytest.approx(0.9 * (0.9 * -3.0 + 0.1 * -1.0) + 0.1 * -5.0)
    restored = HardAttentionObjective()
    restored.load_state_dict(hard.state_dict())
    assert restored.baseline == hard.baseline


def test_caption_loss_uses_the_baseline_before_the_batch():
    torch.manual_seed(0)
    T, V = 3, len(VOCAB)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    out = DecoderOutput(torch.randn(2, T, V), torch.full((2, T, L), 1 / L), mask,
                        sample_log_probs=torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.3, 0.0]]),
                        entropy=torch.zeros(2, T))
    targets = torch.tensor([[4, 5, 2], [6, 2, 0]])
    nll = -out.logits.log_softmax(-1).gather(2, targets.unsqueeze(-1)).squeeze(-1) * mask  # (B, T)
    log_likelihood = -nll.sum(1)  # (B,)
    hard = HardAttentionObjective(decay=0.9, entropy_weight=0.0, baseline=-1.0)
    _, parts = caption_loss(out, targets, lambda_ds=0.0, hard=hard)
    advantage = log_likelihood - (-1.0)
    expected = -(advantage * torch.tensor([-3.5, -0.5])).sum() / 5  # per word: 5 words
    assert parts["reinforce"] == pytest.approx(float(expected), abs=1e-5)
    assert hard.baseline == pytest.approx(0.9 * -1.0 + 0.1 * float(log_likelihood.mean()), abs=1e-6)


def test_entropy_bonus_sign():
    torch.manual_seed(0)
    T = 3
    mask = torch.ones(2, T, dtype=torch.bool)
    out = DecoderOutput(torch.randn(2, T, len(VOCAB)), torch.full((2, T, L), 1 / L), mask,
                        entropy=torch.full((2, T), 1.5))
    targets = torch.tensor([[4, 5, 2], [6, 7, 2]])
    loss_none, _ = caption_loss(out, targets, 0.0, HardAttentionObjective(entropy_weight=0.0))
    loss_some, parts = caption_loss(out, targets, 0.0, HardAttentionObjective(entropy_weight=0.1))
    assert parts["entropy"] == pytest.approx(1.5)
    assert float(loss_some) == pytest.approx(float(loss_none) - 0.1 * 1.5)  # more entropy weight, lower loss


def test_gradient_descent_on_the_entropy_bonus_raises_entropy():
    decoder = hard_decoder(sample_prob=0.0)  # expected context: the entropy is deterministic
    annotations, captions, lengths = batch()
    optimizer = torch.optim.SGD(decoder.attention.parameters(), lr=1.0)
    hard = HardAttentionObjective(entropy_weight=1.0)

    def mean_entropy() -> tuple[DecoderOutput, torch.Tensor]:
        out = decoder(annotations, captions, lengths)
        return out, (out.entropy * out.mask).sum() / out.mask.sum()

    out, before = mean_entropy()
    for _ in range(5):
        out, _ = mean_entropy()
        only_entropy = DecoderOutput(out.logits.detach(), out.alphas.detach(), out.mask, None, out.entropy)
        loss, _ = caption_loss(only_entropy, captions[:, 1:], lambda_ds=0.0, hard=hard)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    _, after = mean_entropy()
    before, after = float(before.detach()), float(after.detach())
    assert after > before
    assert after <= torch.log(torch.tensor(float(L))) + 1e-5  # the maximum: uniform over 9 locations


def test_tiny_hard_attention_run_lowers_the_loss():
    decoder = hard_decoder(sample_prob=0.5)
    annotations, captions, lengths = batch()
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-2)
    hard = HardAttentionObjective()
    ce = []
    for _ in range(30):
        loss, parts = caption_loss(decoder(annotations, captions, lengths), captions[:, 1:], 1.0, hard)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(decoder.parameters(), 5.0)
        optimizer.step()
        ce.append(parts["ce"])
    assert all(map(torch.isfinite, map(torch.tensor, ce)))
    assert sum(ce[-5:]) / 5 < 0.5 * sum(ce[:5]) / 5
    assert hard.baseline is not None and hard.baseline < 0  # a log-likelihood

    decoder.eval()  # inference: argmax location, and the expected context
    for mode in ("argmax", "expected"):
        decoder.attention.hard_inference = mode
        out = decoder(annotations, captions, lengths)
        assert out.sample_log_probs is None and torch.isfinite(out.logits).all()


def test_training_passes_sample_prob_without_editing_the_model():
    """train_one_epoch(LoopSettings(sample_prob=...)) decides the sampled path; the model's attention module is
    left alone."""
    from captioner.model.captioner import Captioner
    from captioner.training import LoopSettings, train_one_epoch

    torch.manual_seed(0)
    model = Captioner(ModelConfig(encoder="small_cnn", encoder_weights=None, grid=7, hidden_dim=16, embed_dim=8,
                                  attention_dim=8, attention="hard"), VOCAB)
    model.decoder.attention.sample_prob = 0.0  # its own default would never sample
    _, captions, lengths = batch()
    annotations = torch.randn(captions.shape[0], 49, model.cfg.encoder_channels)  # cached features (B, L, C)
    loader = [{"inputs": annotations, "captions": captions, "lengths": lengths}] * 3
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    hard = HardAttentionObjective(0.9, 0.002, 0.1)
    stats = train_one_epoch(model, loader, optimizer,
                            LoopSettings(lambda_ds=0.0, grad_clip=5.0, progress=False, sample_prob=1.0), hard)
    assert "reinforce" in stats and model.decoder.attention.sample_prob == 0.0
    stats = train_one_epoch(model, loader, optimizer, LoopSettings(lambda_ds=0.0, grad_clip=5.0, progress=False),
                            HardAttentionObjective(0.9, 0.002, 0.1))
    assert "reinforce" not in stats  # None: the module's own setting
