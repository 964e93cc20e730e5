"""One encode -> decode -> result loop for every caller; the encoder knows its grid; configs are not mutated."""

import dataclasses

import pytest
import torch

from captioner.model.config import ModelConfig
from captioner.decoding.config import DecodingConfig
from captioner.encoders import build_encoder
from captioner.model.captioner import Captioner
from captioner.vocab import Vocabulary

VOCAB = Vocabulary(["a", "red", "blue", "circle", "square", "small", "big"])


@pytest.mark.parametrize("name, grid", [("small_cnn", 14), ("small_cnn", 7), ("efficientnet_lite0", 14),
                                        ("efficientnet_lite0", 7), ("efficientnet_lite0_ms", 14)])
@pytest.mark.parametrize("size", [224, 200, 97])
def test_encoder_reports_its_grid_without_a_forward_pass(name, grid, size, monkeypatch):
    torch.manual_seed(0)
    encoder = build_encoder(name, weights=None, grid=grid).eval()
    with torch.no_grad():
        measured = tuple(encoder.feature_map(torch.zeros(1, 3, size, size)).shape[-2:])
    monkeypatch.setattr(type(encoder), "feature_map", lambda *a: pytest.fail("grid_size ran the network"))
    assert encoder.grid_size(size) == measured


def tiny(**kw) -> Captioner:
    torch.manual_seed(0)
    return Captioner(ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=16, embed_dim=8,
                                 attention_dim=8, dropout=0.0, **kw), VOCAB,
                     decoding=DecodingConfig(max_len=5)).eval()


def test_captioner_leaves_the_given_config_alone():
    cfg = ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=16, embed_dim=8, attention_dim=8)
    before = dataclasses.asdict(cfg)
    model = Captioner(cfg, VOCAB)
    assert dataclasses.asdict(cfg) == before
    assert model.cfg.vocab_size == len(VOCAB) and model.cfg.encoder_channels == model.encoder.channels


def test_caption_batch_and_evaluation_share_one_loop(shapes_json, monkeypatch, tmp_path):
    """caption(), batch.caption_paths and evaluate_split all go through Captioner.caption_tensors and agree."""
    from captioner.batch.captioning import caption_paths
    from captioner.data.karpathy import ImageFileLoader, KarpathySplit
    from captioner.evaluation.evaluate import evaluate_split

    model = tiny()
    split = KarpathySplit.load(shapes_json, "test")
    split.records = split.records[:3]
    calls = []
    real = Captioner.caption_tensors

    def counting(self, inputs, *args, **kwargs):
        calls.append(inputs.shape[0])
        return real(self, inputs, *args, **kwargs)

    monkeypatch.setattr(Captioner, "caption_tensors", counting)
    direct = [r.text for r in model.caption(split.image_paths, beam_size=2, max_len=5)]
    batched = [r["caption"] for r in caption_paths(model, split.image_paths, beam_size=2, max_len=5)]
    _, results = evaluate_split(model, split, ImageFileLoader(split.image_paths, model.preprocessing.transform()),
                                model.decoding.updated(beam_size=2, max_len=5), meteor=False, progress=False)
    assert direct == batched == [r["caption"] for r in results]
    assert sum(calls) == 3 * len(split)
