"""Attention modules: every score function gives a distribution over the grid; masks give exact zeros."""

import pytest
import torch

from captioner.model.attention import SCORES, AttentionScore, ChannelAttention, SpatialAttention, masked_softmax

B, C, Q, A = 3, 12, 10, 16  # batch, annotation channels, query (decoder state) size, attention size


def grid_mask(L: int, seed: int = 0) -> torch.Tensor:
    """A random (B, L) mask with at least one visible location per row."""
    mask = torch.rand(B, L, generator=torch.Generator().manual_seed(seed)) < 0.5
    mask[:, 0] = True
    return mask


@pytest.mark.parametrize("grid", [(7, 7), (5, 3), (1, 1)])
@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("value_proj", [False, True])
def test_soft_attention_gives_a_distribution(score, grid, value_proj):
    torch.manual_seed(0)
    L = grid[0] * grid[1]
    attention = SpatialAttention(score, C, Q, A, value_proj=value_proj)
    annotations, query = torch.randn(B, L, C), torch.randn(B, Q)
    keys, values = attention.prepare(annotations)
    for mask in (None, grid_mask(L)):
        context, alpha, index = attention(keys, values, query, mask)
        assert alpha.shape == (B, L) and context.shape == (B, C) and index is None
        assert torch.isfinite(alpha).all() and (alpha >= 0).all()
        assert torch.allclose(alpha.sum(-1), torch.ones(B), atol=1e-6)
        if mask is not None:
            assert (alpha[~mask] == 0).all()  # exactly zero, not just small
        assert torch.allclose(context, torch.einsum("bl,blc->bc", alpha, values), atol=1e-5)  # the expectation


@pytest.mark.parametrize("grid", [5, 3, 1])
@pytest.mark.parametrize("score", SCORES)
def test_location_aware_attention_uses_its_history(score, grid):
    """With (alpha_{t-1}, coverage) as input the result is still a distribution, and the history changes it."""
    torch.manual_seed(0)
    L = grid * grid
    attention = SpatialAttention(score, C, Q, A, location_grid=grid)
    torch.nn.init.normal_(attention.score.location.weight)  # zero-initialised: give it something to do
    annotations, query = torch.randn(B, L, C), torch.randn(B, Q)
    keys, values = attention.prepare(annotations)
    history = torch.rand(B, 2, L)
    history[:, 0] /= history[:, 0].sum(-1, keepdim=True)  # alpha_{t-1} is a distribution
    for mask in (None, grid_mask(L)):
        _, alpha, _ = attention(keys, values, query, mask, history=history)
        assert torch.isfinite(alpha).all() and torch.allclose(alpha.sum(-1), torch.ones(B), atol=1e-6)
        if mask is not None:
            assert (alpha[~mask] == 0).all()
    if L > 1:
        _, other, _ = attention(keys, values, query, history=history.flip(-1))
        _, alpha, _ = attention(keys, values, query, history=history)
        assert not torch.allclose(alpha, other)


def test_location_aware_attention_starts_as_the_plain_score():
    torch.manual_seed(0)
    plain, located = AttentionScore("additive", C, Q, A), AttentionScore("additive", C, Q, A, location_grid=4)
    located.load_state_dict(plain.state_dict(), strict=False)
    keys, query = plain.project_keys(torch.randn(B, 16, C)), torch.randn(B, Q)
    assert torch.allclose(plain(keys, query), located(keys, query, torch.rand(B, 2, 16)))


@pytest.mark.parametrize("score", SCORES)
def test_scores_depend_on_the_query(score):
    torch.manual_seed(0)
    module = AttentionScore(score, C, Q, A)
    keys = module.project_keys(torch.randn(B, 15, C))
    e1, e2 = module(keys, torch.randn(B, Q)), module(keys, torch.randn(B, Q))
    assert e1.shape == (B, 15) and not torch.allclose(e1, e2)


def test_unknown_score_is_refused():
    with pytest.raises(ValueError, match="additive"):
        AttentionScore("bilinear-ish", C, Q, A)


def test_masked_softmax_exact_zeros_and_extremes():
    scores = torch.tensor([[1e4, -1e4, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[False, True, True, True], [True, True, False, False]])
    alpha = masked_softmax(scores, mask)
    assert alpha[0, 0] == 0 and alpha[1, 2] == 0 and alpha[1, 3] == 0  # the huge masked score is ignored
    assert torch.allclose(alpha.sum(-1), torch.ones(2))
    assert torch.allclose(alpha[1, :2], torch.tensor([0.5, 0.5]))
    assert torch.equal(masked_softmax(scores, None), scores.softmax(-1))


@pytest.mark.parametrize("grid", [(7, 7), (5, 3)])
def test_hard_attention_samples_only_visible_locations(grid):
    torch.manual_seed(0)
    L = grid[0] * grid[1]
    attention = SpatialAttention("additive", C, Q, A, hard=True).train()
    annotations, query, mask = torch.randn(B, L, C), torch.randn(B, Q), grid_mask(L)
    keys, values = attention.prepare(annotations)
    for _ in range(20):
        context, alpha, index = attention(keys, values, query, mask, use_sample=True)
        assert mask[torch.arange(B), index].all()
        assert torch.equal(context, values[torch.arange(B), index])
        assert torch.allclose(alpha.sum(-1), torch.ones(B), atol=1e-6)
    attention.eval()
    attention.hard_inference = "argmax"
    context, alpha, _ = attention(keys, values, query, mask)
    assert torch.equal(context, values[torch.arange(B), alpha.argmax(-1)])
    attention.hard_inference = "expected"
    context, alpha, _ = attention(keys, values, query, mask)
    assert torch.allclose(context, torch.einsum("bl,blc->bc", alpha, values), atol=1e-5)


@pytest.mark.parametrize("L", [49, 15])
def test_channel_attention_weights_sum_to_one(L):
    torch.manual_seed(0)
    channel = ChannelAttention(C, Q, A)
    annotations, query = torch.randn(B, L, C), torch.randn(B, Q)
    rescaled, weights = channel(annotations, query)
    assert weights.shape == (B, C) and (weights > 0).all()
    assert torch.allclose(weights.sum(-1), torch.ones(B), atol=1e-6)
    assert rescaled.shape == (B, L, C)
    assert torch.allclose(rescaled, annotations * weights.unsqueeze(1) * C, atol=1e-6)  # mean weight 1


@pytest.mark.parametrize("grid", [1, 3, 14, 16, 17])
def test_one_channel_location_features_equal_the_convolution(grid):
    """The dot-product scores' location term is computed as a (2L, L) product for grids up to 16 (faster in training): the
    same values and gradients as the 3x3 convolution it replaces; larger grids keep the convolution."""
    torch.manual_seed(0)
    score = AttentionScore("scaled_dot", C, Q, A, location_grid=grid)
    torch.nn.init.normal_(score.location.weight)
    torch.nn.init.normal_(score.location.bias)
    history = torch.rand(B, 2, grid * grid, requires_grad=True)
    params = [history, score.location.weight, score.location.bias]
    conv = score.location(history.reshape(B, 2, grid, grid)).flatten(2).transpose(1, 2)  # (B, L, 1)
    with torch.no_grad():
        score.location_features(history)  # decoding: the product only up to grid 16, kept on the module
    assert ("_location_operator" in score.__dict__) == (grid <= 16)
    got = score.location_features(history)
    assert got.shape == conv.shape and torch.allclose(got, conv, atol=1e-5)
    upstream = torch.randn_like(conv)
    for a, b in zip(torch.autograd.grad(got, params, upstream), torch.autograd.grad(conv, params, upstream)):
        assert torch.allclose(a, b, atol=1e-4)


def test_location_product_is_rebuilt_when_the_weights_change():
    """Without autograd the (2L, L) matrix is kept between steps; an in-place update (an optimiser step, a write
    through ``.data`` that leaves no version, a fused Adam step) or a new weight tensor must not reuse it."""
    torch.manual_seed(0)
    score = AttentionScore("dot", C, Q, A, location_grid=4)
    history = torch.rand(B, 2, 16)
    conv = lambda: score.location(history.reshape(B, 2, 4, 4)).flatten(2).transpose(1, 2)  # noqa: E731
    with torch.no_grad():
        assert torch.equal(score.location_features(history), conv())  # zero-initialised: both the bias
        assert score.location_operator() is score.location_operator()  # kept
        score.location.weight.normal_()
        assert torch.allclose(score.location_features(history), conv(), atol=1e-5)
        score.location.weight = torch.nn.Parameter(torch.randn(1, 2, 3, 3))
        assert torch.allclose(score.location_features(history), conv(), atol=1e-5)
        score.location.weight.data.mul_(-2.0)  # no version change
        assert torch.allclose(score.location_features(history), conv(), atol=1e-5)
    optimizer = torch.optim.Adam(score.parameters(), lr=0.5, fused=True)
    score.location_features(torch.rand(B, 2, 16, requires_grad=True)).sum().backward()
    optimizer.step()
    with torch.no_grad():
        assert torch.allclose(score.location_features(history), conv(), atol=1e-5)


def test_location_product_serves_training_after_inference_mode():
    """Beam search (inference_mode) before a training step: the kept index tensors and matrix must not be
    inference tensors inside autograd."""
    from captioner.model import attention

    attention._conv_taps.cache_clear()
    torch.manual_seed(0)
    score = AttentionScore("scaled_dot", C, Q, A, location_grid=5)
    history = torch.rand(B, 2, 25)
    with torch.inference_mode():
        score.location_features(history)
    score.location.weight.requires_grad_(False)  # a frozen term: history still needs its gradient
    h = history.clone().requires_grad_()
    score.location_features(h).sum().backward()
    score.location.weight.requires_grad_(True)
    score.location_features(history).sum().backward()
    assert h.grad is not None and score.location.weight.grad is not None
