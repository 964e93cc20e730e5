"""Look-alike channels (captioner/scenes/lookalike.py; they let a model tell an object repeated elsewhere from one alone): what each location's channels say, where they go, and
that a checkpoint keeps them."""

import pytest
import torch

import captioner
from captioner.model.config import ModelConfig
from captioner.model.decoder import Decoder
from tests.flat_configs import configs
from captioner.scenes import lookalike
from captioner.scenes.plugin import model_settings
from captioner.scenes.lookalike import LookAlike, far_mask, lookalike_radius

GRID, C = 8, 12


def test_far_mask_leaves_out_each_cell_and_its_neighbours():
    far = far_mask(GRID, 2)  # (64, 64)
    assert far.shape == (GRID * GRID, GRID * GRID) and torch.equal(far, far.T)
    assert far.diagonal().sum() == 0
    cell = 3 * GRID + 3  # (3, 3): the 5x5 block around it is near, everything else far
    near = {r * GRID + c for r in range(1, 6) for c in range(1, 6)}
    assert {i for i in range(GRID * GRID) if far[cell, i] == 0} == near
    assert lookalike_radius(14) == 3 and lookalike_radius(7) == 1 and lookalike_radius(2) == 1


def scene(copies: int, seed: int = 0) -> torch.Tensor:
    """A grid of unrelated features with one feature vector placed at ``copies`` cells far apart: (1, L, C)."""
    g = torch.Generator().manual_seed(seed)
    grid = torch.randn(1, GRID * GRID, C, generator=g)
    thing = torch.randn(C, generator=g) * 3
    for cell in (0, GRID * GRID - 1, GRID - 1)[:copies]:  # three corners
        grid[0, cell] = thing
    return grid


def test_a_location_with_a_copy_far_away_says_so():
    """Untrained (the initial scale and offset), an object's cell scores higher when an identical object lies far
    from it than when it is alone, and higher still with two copies elsewhere: the mass is not normalised."""
    torch.manual_seed(0)
    heads = LookAlike(C, heads=4, grid=GRID).eval()
    with torch.no_grad():
        one, two, three = (heads(scene(n))[0, 0].expm1() for n in (1, 2, 3))  # (K,) masses at the first copy
    # each copy adds sigmoid(scale * 1 + offset) = 0.99, less what the random cell it replaced added
    assert (two - one > 0.3).all() and (three - two > 0.3).all()


def test_shapes_and_gradients():
    torch.manual_seed(0)
    heads = LookAlike(C, heads=3, grid=GRID)
    a = torch.randn(2, GRID * GRID, C, requires_grad=True)
    out = heads(a)
    assert out.shape == (2, GRID * GRID, 3) and torch.isfinite(out).all() and (out >= 0).all()
    out.square().sum().backward()
    for name, p in [*heads.named_parameters(), ("annotations", a)]:
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    with pytest.raises(ValueError, match="locations"):
        heads(torch.randn(1, 10, C))


def decoder_cfg(**changes) -> ModelConfig:
    base = dict(encoder="small_cnn", encoder_weights=None, grid=GRID, encoder_channels=C, hidden_dim=16,
                embed_dim=8, attention_dim=8, dropout=0.0, vocab_size=12, score="scaled_dot", positional=4,
                lookalike=2)
    return configs(**{**base, **changes})[0]


def test_the_decoder_attends_over_the_appended_channels():
    """The annotations the decoder attends over are [encoder channels; positional; look-alike], and the context z
    carries the look-alike channels of what alpha covers."""
    torch.manual_seed(0)
    dec = Decoder.build(decoder_cfg()).eval()
    a = torch.randn(2, GRID * GRID, C)
    state = dec.init_state(a)
    assert state.annotations.shape == (2, GRID * GRID, C + 4 + 2)
    assert torch.equal(state.annotations[..., :C], a)
    assert torch.allclose(state.annotations[..., C + 4:], dec.extension.lookalike(a))
    assert decoder_cfg().annotation_channels == C + 4 + 2 and decoder_cfg(lookalike=0).annotation_channels == C + 4
    assert Decoder.build(decoder_cfg(lookalike=0)).extension is None
    z, alpha, _ = dec.context(state, None, dec.embedding(torch.tensor([3, 4])))  # (B, C + 4 + 2), (B, L)
    expected = torch.einsum("bl,blk->bk", alpha, state.annotations[..., C + 4:])  # alpha-weighted look-alikes
    assert torch.allclose(z[:, C + 4:], expected, atol=1e-6)


def test_config_round_trip_older_checkpoints_and_too_small_grids():
    assert ModelConfig.from_dict(decoder_cfg().to_dict()).plugin_config["lookalike"] == 2
    legacy = decoder_cfg(count_head=True).to_dict()
    legacy["plugin_config"].pop("lookalike")  # checkpoints written before the setting existed
    old = ModelConfig.from_dict(legacy)
    assert model_settings(old.plugin_config).lookalike == 0
    assert Decoder.build(old).extension.lookalike is None
    from captioner.errors import ConfigError

    with pytest.raises(ConfigError, match="lookalike.*grid of at least 3"):
        decoder_cfg(grid=2).validate()
    decoder_cfg(grid=3).validate()


def test_a_checkpoint_with_lookalike_channels_captions_the_same_after_loading(tmp_path):
    """save_pretrained / load round trip: the look-alike weights are saved and the same caption comes back."""
    import captioner
    from captioner.model.captioner import Captioner
    from captioner.vocab import Vocabulary

    torch.manual_seed(0)
    vocab = Vocabulary(["a", "red", "blue", "circle", "square", "two", "small", "and"])
    cfg = ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=16, embed_dim=8, attention_dim=8,
                      grid=4, plugin="scenes", plugin_config={"lookalike": 2}, score="scaled_dot")
    model = Captioner(cfg, vocab, encoder_weights=None).eval()
    with torch.no_grad():  # a visible change from the init, so that loading must restore it
        model.decoder.extension.lookalike.offset.fill_(-1.5)
    captioner.save_pretrained(model, tmp_path / "ckpt")
    loaded = captioner.load(tmp_path / "ckpt")
    assert loaded.cfg.plugin_config["lookalike"] == 2
    assert torch.equal(loaded.decoder.extension.lookalike.offset, model.decoder.extension.lookalike.offset)
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        a, b = model.caption_tensors(images, beam_size=3), loaded.caption_tensors(images, beam_size=3)
    assert [h.tokens for h in a] == [h.tokens for h in b]


def test_the_probe_auc():
    """experiments/lookalike_probe.py's AUC: 1 for perfect separation, 0 reversed, 0.5 for ties, half-right orders."""
    import numpy as np

    from experiments.lookalike_probe import auc

    assert auc(np.array([3.0, 4.0]), np.array([1.0, 2.0])) == 1.0
    assert auc(np.array([1.0]), np.array([2.0, 3.0])) == 0.0
    assert auc(np.array([1.0, 1.0]), np.array([1.0])) == 0.5
    assert auc(np.array([2.0, 0.0]), np.array([1.0])) == 0.5  # one of the two pairs ordered right


@pytest.mark.parametrize("block_bytes", [1, 3 * 81 * 4, 4 << 20], ids=["one_row_blocks", "three_row_blocks",
                                                                    "one_block"])
def test_the_fused_form_is_the_formula(monkeypatch, block_bytes):
    """forward() folds the offset into the products and computes the far cells' mass in blocks of rows (FarMass);
    it equals the module doc's formula, and so do its gradients."""
    monkeypatch.setattr(lookalike, "BLOCK_BYTES", block_bytes)
    torch.manual_seed(0)
    heads = LookAlike(C, heads=3, grid=GRID)
    with torch.no_grad():
        heads.scale.copy_(torch.tensor([4.0, 10.0, 20.0]))
        heads.offset.copy_(torch.tensor([-1.0, -5.0, -12.0]))
    a = torch.randn(2, GRID * GRID, C)
    q = torch.nn.functional.normalize(heads.proj(a).view(2, GRID * GRID, 3, 16), dim=-1)  # (B, L, K, d)
    cos = torch.einsum("bikd,bjkd->bkij", q, q)  # (B, K, L, L)
    far = far_mask(GRID, lookalike_radius(GRID))
    expected = (torch.sigmoid(cos * heads.scale.view(1, 3, 1, 1) + heads.offset.view(1, 3, 1, 1)) * far).sum(-1)
    expected = expected.log1p().transpose(1, 2)  # (B, L, K)
    got = heads(a)
    assert torch.allclose(got, expected, atol=1e-5)
    weights = torch.randn(got.shape)  # any downstream gradient
    grads = [torch.autograd.grad((y * weights).sum(), list(heads.parameters())) for y in (got, expected)]
    for ours, autograd in zip(*grads):
        assert torch.allclose(ours, autograd, atol=1e-5, rtol=1e-4)


def test_far_mass_gradcheck(monkeypatch):
    """FarMass's hand-written backward against finite differences (float64, blocks of two rows)."""
    g = torch.Generator().manual_seed(0)
    query = torch.randn(5, 9, 3, dtype=torch.float64, generator=g, requires_grad=True)
    key = torch.randn(5, 9, 3, dtype=torch.float64, generator=g, requires_grad=True)
    far = far_mask(3, 1).double()
    monkeypatch.setattr(lookalike, "BLOCK_BYTES", 2 * 81 * 8)
    assert float(far.sum()) > 0 and float(far.sum()) < 81
    assert torch.autograd.gradcheck(lambda q, k: lookalike.FarMass.apply(q, k, far), (query, key))


@pytest.mark.parametrize("sample_prob", [0.0, 1.0], ids=["expected", "sampled"])
def test_hard_attention_trains_the_channels(sample_prob):
    """Hard attention (the expected context or one sampled location per word): the words' loss still reaches the
    look-alike projection, scale and offset."""
    torch.manual_seed(0)
    dec = Decoder.build(decoder_cfg(attention="hard", location=True)).train()
    captions = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 2, 0]])
    out = dec(torch.randn(2, GRID * GRID, C), captions, torch.tensor([5, 4]), sample_prob=sample_prob)
    torch.nn.functional.cross_entropy(out.logits[out.mask], captions[:, 1:][out.mask]).backward()
    for name, p in dec.extension.lookalike.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_far_mass_under_bf16_autocast_and_without_gradients():
    """Under bf16 autocast (--amp bf16) the blocks are bf16 and the backward still runs; without a gradient no block
    is kept; the backward is once differentiable."""
    torch.manual_seed(0)
    heads = LookAlike(C, heads=2, grid=GRID)
    a = torch.randn(3, GRID * GRID, C)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = heads(a)
    out.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in heads.parameters())
    exact = heads(a)
    assert torch.allclose(out.float(), exact, atol=0.1)
    query = torch.randn(2, 9, 3, requires_grad=True)
    with torch.no_grad():
        mass = lookalike.FarMass.apply(query, query, far_mask(3, 1))
    assert mass.shape == (2, 9) and mass.grad_fn is None
    (grad,) = torch.autograd.grad(lookalike.FarMass.apply(query, query.detach(), far_mask(3, 1)).sum(), query,
                                  create_graph=True)
    with pytest.raises(RuntimeError):
        grad.sum().backward()


def test_near_channels_see_a_copy_that_the_usual_radius_leaves_out():
    """lookalike_near: more channels after the usual ones, whose left-out block is only the 3x3 cells around each
    location. A copy two cells away is among the near channels' look-alikes and not among the usual ones'."""
    torch.manual_seed(0)
    dec = Decoder.build(decoder_cfg(lookalike=2, lookalike_near=3)).eval()
    assert decoder_cfg(lookalike=2, lookalike_near=3).annotation_channels == C + 4 + 2 + 3
    assert torch.equal(dec.extension.lookalike_near.far, far_mask(GRID, lookalike.NEAR_RADIUS))
    assert Decoder.build(decoder_cfg()).extension.lookalike_near is None
    a = torch.randn(1, GRID * GRID, C)
    state = dec.init_state(a)
    assert torch.allclose(state.annotations[..., C + 4:C + 6], dec.extension.lookalike(a))
    assert torch.allclose(state.annotations[..., C + 6:], dec.extension.lookalike_near(a))
    alone = a.clone()
    alone[0, 2 * GRID + 2] = torch.randn(C) * 3  # an object at (2, 2)
    close = alone.clone()
    close[0, 2 * GRID + 4] = alone[0, 2 * GRID + 2]  # and its copy two cells along the row
    with torch.no_grad():
        mass = lambda heads, x: heads(x)[0, 2 * GRID + 2].expm1()  # noqa: E731  (K,) the far mass at (2, 2)
        usual_gain = mass(dec.extension.lookalike, close) - mass(dec.extension.lookalike, alone)
        near_gain = mass(dec.extension.lookalike_near, close) - mass(dec.extension.lookalike_near, alone)
    assert lookalike.lookalike_radius(GRID) >= 2  # the copy is inside the usual left-out block...
    assert torch.allclose(usual_gain, torch.zeros(2), atol=1e-5)
    assert (near_gain > 0.3).all()  # ...and seen by the near channels (the cell it replaced added less)


def test_near_channels_are_trained_checked_and_optional_in_old_checkpoints():
    from captioner.errors import ConfigError

    torch.manual_seed(0)
    dec = Decoder.build(decoder_cfg(lookalike_near=2)).train()
    captions = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 2, 0]])
    out = dec(torch.randn(2, GRID * GRID, C), captions, torch.tensor([5, 4]))
    torch.nn.functional.cross_entropy(out.logits[out.mask], captions[:, 1:][out.mask]).backward()
    for name, p in dec.extension.lookalike_near.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    legacy = decoder_cfg().to_dict()
    assert "lookalike_near" not in legacy["plugin_config"]  # as in checkpoints written before the setting existed
    old = ModelConfig.from_dict(legacy)
    assert model_settings(old.plugin_config).lookalike_near == 0
    assert Decoder.build(old).extension.lookalike_near is None
    with pytest.raises(ConfigError, match="lookalike_near"):
        ModelConfig.from_dict({**legacy, "plugin_config": {**legacy["plugin_config"], "lookalike_near": -1}})
    with pytest.raises(ConfigError, match="lookalike_near.*grid of at least 3"):
        decoder_cfg(grid=2, lookalike=0, lookalike_near=1).validate()
