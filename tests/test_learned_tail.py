"""Look-alike channels on frozen annotations: training sends the gradient to those channels alone
(``Decoder._init_state_tail``, ``StepReads(tail=...)``) and computes what the plain concatenation computes."""

import copy

import pytest
import torch

from captioner.losses import caption_loss
from captioner.scst import sample_captions, scst_loss
from captioner.step_grad import StepReads
from test_decoder_speedpaths import caption_batch, paper_like

RECIPE_LIKE = {"location": True, "score": "scaled_dot", "word_query": True, "positional": 4, "lookalike": 2}


def twins(changes: dict):
    """The decoder under test, and a copy that never takes the tail path (the plain concatenation)."""
    tail = paper_like(**changes).train()
    if tail.attention.score.location is not None:
        torch.nn.init.normal_(tail.attention.score.location.weight)  # starts at zero: make the history count
    plain = copy.deepcopy(tail)
    plain._learned_tail = lambda annotations: False
    return tail, plain


def gradients(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def assert_same_gradients(a, b):
    ga, gb = gradients(a), gradients(b)
    assert len(ga) == len(gb) == sum(1 for p in a.parameters() if p.requires_grad)
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, atol=1e-5, rtol=1e-4)
    look = a.lookalike.proj.weight.grad
    assert look is not None and float(look.abs().sum()) > 0  # the channels do learn through the tail


HARD = {**RECIPE_LIKE, "attention": "hard"}


@pytest.mark.parametrize("changes, sample_prob", [
    (RECIPE_LIKE, None), (HARD, 1.0), (HARD, 0.0), ({**HARD, "score": "additive"}, 1.0), ({"lookalike": 2}, None),
    ({"lookalike": 2, "count_head": True, "count_mask": True}, None)],
    ids=["soft_recipe", "hard_recipe_sampled", "hard_recipe_expected", "hard_additive", "additive", "count_mask"])
@pytest.mark.parametrize("grouped", [False, True], ids=["per_caption", "by_image"])
def test_teacher_forcing_with_the_tail_equals_the_concatenation(monkeypatch, changes, sample_prob, grouped):
    """Logits, alphas and every parameter's gradient are those of the plain path, per caption and in batches of
    whole images, hard attention's sampled and expected contexts included; the tail path is taken (a StepReads
    with a tail for the values)."""
    tails = []
    real = StepReads.__init__
    monkeypatch.setattr(StepReads, "__init__",
                        lambda self, *a, **k: tails.append(k.get("tail") is not None) or real(self, *a, **k))
    tail, plain = twins(changes)
    images, captions, lengths = caption_batch()
    image_of = torch.tensor([2, 0, 2, 2, 2, 0]) if grouped else None
    if grouped:
        images = images[:3]
    outs = []
    for model in (tail, plain):
        torch.manual_seed(3)  # hard attention samples: the same draws
        out = model(images, captions, lengths, sample_prob=sample_prob, image_of=image_of)
        loss = caption_loss(out, captions[:, 1:], lambda_ds=1.0)[0]
        if out.sample_log_probs is not None:  # hard attention's REINFORCE term reaches alpha through the picks
            loss = loss - (out.sample_log_probs * out.mask).sum()
        loss.backward()
        outs.append(out)
    assert torch.allclose(outs[0].logits, outs[1].logits, atol=1e-5)
    assert torch.allclose(outs[0].alphas, outs[1].alphas, atol=1e-6)
    assert_same_gradients(tail, plain)
    assert any(tails)  # the tail's reads for the values
    if changes.get("score", "additive") != "additive":
        assert not all(tails)  # and the dot-product keys' reads, without one


def test_self_critical_sampling_with_the_tail_equals_the_concatenation():
    """SCST's sampled captions, their log-probabilities and the loss's gradients are those of the plain path."""
    tail, plain = twins(RECIPE_LIKE)
    images = torch.randn(3, 9, 8, generator=torch.Generator().manual_seed(5))
    results = []
    for model in (tail, plain):
        torch.manual_seed(11)
        s = sample_captions(model, images, 4, 1, 2, max_len=6)
        advantage = torch.linspace(-1.0, 1.0, s.words.shape[0])
        scst_loss(s, advantage).backward()
        results.append(s)
    assert torch.equal(results[0].words, results[1].words)
    assert torch.allclose(results[0].log_probs, results[1].log_probs, atol=1e-5)
    assert_same_gradients(tail, plain)


def test_no_tail_without_a_gradient_or_with_a_trained_encoder():
    """Decoding (no autograd) and a fine-tuned encoder's annotations (they need their gradient) take the plain
    concatenation: the state has no tail."""
    model = paper_like(**RECIPE_LIKE).train()
    images = torch.randn(2, 9, 8)
    assert model.init_state(images).tail is not None
    with torch.no_grad():
        assert model.init_state(images).tail is None
    assert model.init_state(images.requires_grad_()).tail is None


def test_step_reads_tail_must_be_the_sources_last_columns():
    with pytest.raises(ValueError, match="tail"):
        StepReads(torch.randn(2, 9, 8, requires_grad=True), tail=torch.randn(2, 9, 2))
    with pytest.raises(ValueError, match="tail"):
        StepReads(torch.randn(2, 9, 8), tail=torch.randn(2, 5, 2))
