"""Encoder backends: the same weights run as eager NCHW, channels_last or torch.compile give the same annotations
and captions; the weights (state dict, checkpoint, cache fingerprint) do not depend on the backend."""

import copy
import pickle

import pytest
import torch

from captioner.allocator import MMAP_THRESHOLD
from captioner.model.config import ModelConfig
from captioner.data.cache import weights_digest
from captioner.encoders import Preprocessing, build_encoder
from captioner.encoders.base import CHUNK_IMAGE_SIDE, DEFAULT_BACKEND, ENCODER_BACKENDS
from captioner.model.captioner import Captioner
from captioner.vocab import Vocabulary


def hypercolumn_encoder(seed: int = 0):
    torch.manual_seed(seed)
    return build_encoder("efficientnet_lite0_ms", weights=None, grid=14).eval()


def test_channels_last_gives_eager_annotations():
    encoder = hypercolumn_encoder()
    assert encoder.backend == DEFAULT_BACKEND == "channels_last"
    images = torch.randn(5, 3, 64, 64)
    with torch.no_grad():
        fast = encoder(images)  # (5, L, C), in chunks of 4 and 1
        encoder.set_backend("eager")
        assert encoder.cpu_chunk == 1
        reference = encoder(images)
    assert fast.shape == reference.shape == (5, 16, 232)
    torch.testing.assert_close(fast, reference, rtol=1e-4, atol=1e-4)


def test_default_chunk_keeps_every_activation_below_the_mmap_ceiling():
    """No layer output of a chunk of the default backend, at the shipped input size, is larger than glibc's mmap
    ceiling: with 8 images the 96 x 112 x 112 expansion (38.5 MB) was mmapped and page-faulted in at every chunk
    (docs/benchmarks.md). Layer outputs only: oneDNN's own scratch buffers are not seen here."""
    encoder = hypercolumn_encoder()
    side = Preprocessing().size
    largest = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: largest.append(out.numel() * out.element_size()))
             for m in encoder.modules() if not list(m.children())]
    with torch.no_grad():
        encoder.forward_all(torch.zeros(1, 3, side, side))
    for h in hooks:
        h.remove()
    per_image = max(largest)
    assert side == CHUNK_IMAGE_SIDE and per_image == 96 * (side // 2) ** 2 * 4
    assert encoder.cpu_chunk * per_image < MMAP_THRESHOLD < 8 * per_image


def test_larger_inputs_are_encoded_fewer_at_a_time(monkeypatch):
    encoder = hypercolumn_encoder()
    calls = []
    monkeypatch.setattr(encoder, "forward_all", lambda x: calls.append(x.shape[0]) or torch.zeros(x.shape[0], 1, 1))
    encoder(torch.zeros(9, 3, 224, 224))
    assert calls == [4, 4, 1]
    calls.clear()
    encoder(torch.zeros(3, 3, 320, 320))  # 4 * 224^2 / 320^2 = 1.96: one image per call
    assert calls == [1, 1, 1]


def test_backend_changes_the_layout_not_the_weights():
    encoder = hypercolumn_encoder()
    conv = encoder.stages[0][0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    digest, state = weights_digest(encoder), {k: v.clone() for k, v in encoder.state_dict().items()}
    encoder.set_backend("eager")
    assert encoder.stages[0][0].weight is conv and conv.is_contiguous()  # the same Parameter, in place
    assert weights_digest(encoder) == digest  # a feature cache built under one backend stays current
    for k, v in encoder.state_dict().items():
        assert torch.equal(v, state[k])


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown encoder backend 'onnx'; choose one of eager, channels_last"):
        hypercolumn_encoder().set_backend("onnx")
    assert set(ENCODER_BACKENDS) == {"eager", "channels_last", "compile"}


def test_fine_tuning_under_channels_last_has_eager_gradients():
    grads = {}
    for backend in ("eager", "channels_last"):
        encoder = hypercolumn_encoder().set_backend(backend)
        encoder.fine_tune(3)
        encoder.train()
        torch.manual_seed(1)
        encoder(torch.randn(4, 3, 64, 64)).square().mean().backward()
        grads[backend] = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.requires_grad}
    assert grads["eager"] and grads["eager"].keys() == grads["channels_last"].keys()
    for name, g in grads["eager"].items():
        torch.testing.assert_close(grads["channels_last"][name], g, rtol=1e-3, atol=1e-5, msg=name)


def test_captions_are_the_same_under_every_cheap_backend():
    torch.manual_seed(0)
    cfg = ModelConfig(encoder="efficientnet_lite0_ms", encoder_weights=None, hidden_dim=32, embed_dim=16,
                      attention_dim=16)
    model = Captioner(cfg, Vocabulary(["a", "red", "blue", "circle", "square"]), encoder_weights=None).eval()
    images = torch.randn(3, 3, 96, 96)
    results = {}
    for backend in ("eager", "channels_last"):
        assert model.optimize_encoder(backend) is model and model.encoder.backend == backend
        results[backend] = [(r.tokens, round(r.log_prob, 4)) for r in model.caption_tensors(images, beam_size=3)]
    assert results["eager"] == results["channels_last"]


def test_copies_leave_the_compiled_function_behind():
    encoder = hypercolumn_encoder().set_backend("compile")
    encoder._compiled = lambda x: x  # stands in for torch.compile's function, bound to this encoder
    for clone in (copy.deepcopy(encoder), pickle.loads(pickle.dumps(encoder))):
        assert clone.backend == "compile" and clone._compiled is None
    assert encoder._compiled is not None


@pytest.mark.slow
def test_compile_gives_eager_annotations():
    encoder = hypercolumn_encoder()
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        reference = encoder.set_backend("eager")(images)
        compiled = encoder.set_backend("compile")(images)
    torch.testing.assert_close(compiled, reference, rtol=1e-3, atol=1e-3)
