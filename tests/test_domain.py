"""The out-of-domain check: fit/score, save/load without pickle, and scenes vs photographs through a tiny model."""

import json
import pickle

import pytest
import torch
from PIL import Image, ImageOps

from captioner.model.config import ModelConfig
from captioner.scenes.shapes import make_image
from captioner.model.domain import (FILENAME, DomainCheck, encode_pooled, fit_domain, fit_from_annotations, fit_from_model,
                              ledoit_wolf, pool_features)
from captioner.errors import CheckpointError
from captioner.model.captioner import Captioner
from captioner.vocab import Vocabulary


def _gaussian(n, d=8, shift=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    scales = torch.linspace(0.5, 3.0, d)
    return torch.randn(n, d, generator=g) * scales + shift  # (N, D)


def test_fit_and_score_round_trip(tmp_path):
    train, held_out = _gaussian(2000), _gaussian(1000, seed=1)
    check = fit_domain(train, held_out, percentile=99.0, feature="mean", dataset="toy")
    new, far = _gaussian(2000, seed=2), _gaussian(200, shift=6.0, seed=3)
    flagged_new = (check.distances(new) > check.threshold).float().mean().item()
    assert flagged_new < 0.03  # ~1% by construction of the threshold
    assert (check.distances(far) > check.threshold).all()
    # annotations (B, L, C) are mean-pooled over locations first
    annotations = far[:4, None, :].expand(4, 5, 8)  # (B, L, C)
    scores, inside = check.score(annotations)
    assert scores.shape == (4,) and not inside.any()
    assert torch.allclose(scores, check.distances(far[:4]))
    result = check.check(annotations)
    assert all(isinstance(i, bool) and isinstance(s, float) and not i for i, s in result)

    path = check.save(tmp_path)
    assert path == tmp_path / FILENAME
    loaded = DomainCheck.load(tmp_path)
    assert (loaded.threshold, loaded.feature, loaded.percentile, loaded.dataset) == (check.threshold, "mean", 99.0,
                                                                                     "toy")
    assert loaded.info["train_images"] == 2000 and loaded.info["held_out_images"] == 1000
    assert torch.allclose(loaded.score(annotations)[0], scores)
    # the same fit from batches of annotations (B, L, C), as a training run's feature cache holds them
    as_batches = fit_from_annotations([train[:1000, None, :], train[1000:, None, :]], [held_out[:, None, :]], "toy",
                                      percentile=99.0, feature="mean")
    assert torch.allclose(as_batches.mean, check.mean) and as_batches.threshold == pytest.approx(check.threshold)


def test_load_reads_no_pickle_and_refuses_bad_files(tmp_path, monkeypatch):
    check = fit_domain(_gaussian(100), feature="mean+std")  # the kind is stored, not assumed
    check.save(tmp_path)
    from safetensors import safe_open
    with safe_open(str(tmp_path / FILENAME), framework="pt") as f:
        assert set(f.keys()) == {"mean", "precision"}
        assert json.loads(f.metadata()["domain"])["feature"] == "mean+std"

    def refuse(*args, **kwargs):
        raise AssertionError("unpickling")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    assert DomainCheck.load(tmp_path).feature == "mean+std"
    assert DomainCheck.load(tmp_path / "nothing here") is None  # an older checkpoint: no check
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / FILENAME).write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="not a valid domain file"):
        DomainCheck.load(tmp_path / "bad")
    from safetensors.torch import save_file
    save_file({"weight": torch.zeros(3)}, str(tmp_path / "bad" / FILENAME))  # another safetensors file
    with pytest.raises(CheckpointError, match="not a captioner domain file"):
        DomainCheck.load(tmp_path / "bad")


def test_shrunk_covariance_is_invertible_with_few_images():
    few = _gaussian(6, d=40)  # fewer images than channels: the sample covariance is singular
    mean, covariance, shrinkage = ledoit_wolf(few)
    assert 0 < shrinkage <= 1 and torch.linalg.eigvalsh(covariance).min() > 0
    check = fit_domain(few)
    assert torch.isfinite(check.distances(_gaussian(5, d=40, seed=9))).all()
    _, _, little = ledoit_wolf(_gaussian(5000, d=4))
    assert little < 0.05  # many images: almost the sample covariance


def test_pool_features_kinds():
    annotations = torch.arange(24, dtype=torch.float32).reshape(1, 4, 6) - 10  # (B, L, C), some means negative
    mean, std = annotations.mean(1), annotations.std(1, unbiased=False)
    assert torch.equal(pool_features(annotations, "mean"), mean)
    assert torch.allclose(pool_features(annotations, "mean+std"), torch.cat([mean, std], 1))
    logs = pool_features(annotations)  # the default, "log-mean+std"
    assert logs.shape == (1, 12) and torch.isfinite(logs).all()
    assert torch.allclose(logs[:, 6:], torch.log(std + 0.01)) and (logs[:, :6] >= torch.log(torch.tensor(0.01))).all()
    with pytest.raises(ValueError, match="not one of"):
        pool_features(annotations, "max")
    # the hand-written std matches torch's on a realistic grid, float16 cache rows included, and leaves its input alone
    rows = torch.rand(3, 196, 40, generator=torch.Generator().manual_seed(0)) * 6  # (B, L, C)
    for x in (rows, rows.half()):
        before = x.clone()
        both = pool_features(x, "mean+std")
        assert torch.allclose(both[:, 40:], x.float().std(1, unbiased=False), atol=1e-6)
        assert torch.equal(x, before)
    check = fit_domain(_gaussian(50, d=12))
    with pytest.raises(ValueError, match="another encoder"):
        check.score(torch.zeros(2, 4, 5))  # 5 channels -> 10-vectors, the check expects 12


def _photos():
    data = pytest.importorskip("skimage.data")
    out = []
    for name in ("astronaut", "chelsea", "coffee", "rocket", "camera"):
        image = Image.fromarray(data.__getattribute__(name)()).convert("RGB")
        w, h = image.size
        out += [image, ImageOps.mirror(image), image.crop((w // 4, h // 4, 3 * w // 4, 3 * h // 4)),
                ImageOps.grayscale(image).convert("RGB")]
    return out


@pytest.mark.slow  # encodes ~320 images at 224 px: 20 s on an idle 2-core machine, minutes on a busy one
def test_scenes_and_photos_separate_through_a_tiny_model(tmp_path):
    """A tiny decoder on the bundled offline encoder (the shipped checkpoints' features), fitted on 200 scenes."""
    torch.manual_seed(0)
    model = Captioner(ModelConfig(encoder="efficientnet_lite0_ms", hidden_dim=16, embed_dim=8, attention_dim=8),
                      Vocabulary("a red circle".split()), encoder_weights="package").eval()
    train = [make_image(0, "train", i)[0] for i in range(200)]
    val = [make_image(0, "val", i)[0] for i in range(60)]
    check = fit_from_model(model, train, val, "synthetic shapes", percentile=100)
    assert check.info["encoder"] == "efficientnet_lite0_ms" and check.feature == "log-mean+std"
    new_scenes = encode_pooled(model, [make_image(12345, "test", i)[0] for i in range(40)])
    photos = encode_pooled(model, _photos())
    assert (check.distances(photos) > check.threshold).all()  # every photo and its variants flagged
    assert (check.distances(new_scenes) > check.threshold).float().mean() <= 0.1  # few new scenes flagged
    # through the stored file, with annotations as a caller has them
    check.save(tmp_path)
    loaded = DomainCheck.load(tmp_path)
    images = [_photos()[0], make_image(12345, "test", 100)[0]]
    annotations = model.encode(torch.stack([model.transform(im) for im in images]))  # (B, L, C)
    (photo_in, photo_score), (scene_in, scene_score) = loaded.check(annotations)
    assert not photo_in and scene_in and photo_score > loaded.threshold >= scene_score


def test_shipped_checkpoints_flag_photos_and_pass_new_scenes():
    """The stored checks of both shipped checkpoints: three photos out, three scenes of an unused seed in."""
    from pathlib import Path

    import captioner

    images = [im for im in _photos()[::4][:3]] + [make_image(12345, "test", i)[0] for i in range(3)]
    for name in ("shapes-soft", "shapes-hard"):
        folder = Path(__file__).resolve().parents[1] / "checkpoints" / name
        check = DomainCheck.load(folder)
        assert check is not None and check.dataset == "synthetic shapes" and check.feature == "log-mean+std"
        assert check.info["encoder"] == "efficientnet_lite0_ms" and check.mean.shape == (464,)
        model = captioner.load(folder)
        with torch.inference_mode():
            annotations = model.encode(torch.stack([model.transform(im) for im in images]))  # (B, L, C)
        assert [inside for inside, _ in check.check(annotations)] == [False] * 3 + [True] * 3


def test_the_threshold_says_how_many_images_set_it(tmp_path):
    """The count of held-out images is saved with the check; few of them make a rough threshold; a file written
    before the count was stored says nothing rather than a wrong number."""
    check = fit_domain(_gaussian(60, d=4), _gaussian(40, d=4), feature="mean")
    assert check.threshold_images == 40 and check.rough_threshold
    assert check.threshold_note() == "out-of-domain threshold set on 40 val images (few: the check is rough)"
    again = DomainCheck.load(check.save(tmp_path).parent)
    assert again.threshold_note() == check.threshold_note()
    many = fit_domain(_gaussian(60, d=4), _gaussian(200, d=4), feature="mean")
    assert many.threshold_note() == "out-of-domain threshold set on 200 val images" and not many.rough_threshold
    assert fit_domain(_gaussian(150, d=4), feature="mean").threshold_note() == \
        "out-of-domain threshold set on 150 training images"
    old = DomainCheck(check.mean, check.precision, check.threshold, "mean", info={})
    assert old.threshold_note() is None and not old.rough_threshold
