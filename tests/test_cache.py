"""Feature cache: reused when current, rebuilt when the encoder, its weights or the image list change."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from captioner.model.config import ModelConfig
from captioner.data.cache import FeatureCache, fingerprint
from captioner.data.karpathy import KarpathySplit
from captioner.model.captioner import Captioner
from captioner.vocab import Vocabulary


@pytest.fixture
def photo_split(tmp_path):
    """Three real photographs (scikit-image, offline) in a Karpathy JSON, all in train."""
    skimage_data = pytest.importorskip("skimage.data")
    recs = []
    for i, name in enumerate(["chelsea", "coffee", "astronaut"]):
        Image.fromarray(getattr(skimage_data, name)()).save(tmp_path / f"{name}.jpg")
        recs.append({"filename": f"{name}.jpg", "split": "train", "imgid": i,
                     "sentences": [{"tokens": ["a", name], "raw": f"a {name}"}]})
    path = tmp_path / "dataset_photos.json"
    path.write_text(json.dumps({"images": recs}))
    return KarpathySplit.load(path, "train")


def frozen_model(seed: int = 0, grid: int = 14) -> Captioner:
    """EfficientNet-Lite0 with random weights but frozen (small_cnn is always trained, so it is never cached)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(encoder="efficientnet_lite0", encoder_weights=None, grid=grid, hidden_dim=32, embed_dim=16,
                      attention_dim=16)
    model = Captioner(cfg, Vocabulary(["a", "chelsea", "coffee", "astronaut"]), encoder_weights=None)
    assert model.encoder.trainable_from is None
    return model


def test_cache_matches_encoder_and_reports_size(photo_split, tmp_path):
    model = frozen_model()
    cache = FeatureCache.open_or_build(model, photo_split, tmp_path / "cache", batch_size=2, progress=False)
    assert not cache.reused and len(cache) == 3
    assert cache.bytes_per_image == 196 * 112 * 2 == cache.meta["bytes_per_image"]
    assert "43,904 bytes/image" in cache.describe() and "built" in cache.describe()
    shard = cache.folder / cache.meta["shards"][0]
    assert shard.stat().st_size - 3 * cache.bytes_per_image < 256  # the .npy header only
    with torch.inference_mode():
        direct = model.encode(torch.stack([model.transform(Image.open(p)) for p in photo_split.image_paths]))
    cached = torch.stack([cache(i) for i in range(3)])  # (3, 196, 112)
    assert cached.shape == direct.shape
    torch.testing.assert_close(cached, direct, rtol=2e-3, atol=2e-3)  # float16 storage


def test_cache_is_reused_when_current(photo_split, tmp_path, monkeypatch):
    model = frozen_model()
    first = FeatureCache.open_or_build(model, photo_split, tmp_path / "cache", progress=False)

    def no_build(*a, **k):
        raise AssertionError("a current cache was rebuilt")

    monkeypatch.setattr(FeatureCache, "_build", staticmethod(no_build))
    again = FeatureCache.open_or_build(model, photo_split, tmp_path / "cache", progress=False)
    assert again.reused and again.folder == first.folder
    assert "reused" in again.describe()


def test_cache_rebuilt_when_encoder_weights_change(photo_split, tmp_path):
    a = FeatureCache.open_or_build(frozen_model(seed=0), photo_split, tmp_path / "cache", progress=False)
    # Same name, same weights source (None), other random weights: only the weights digest tells them apart.
    b = FeatureCache.open_or_build(frozen_model(seed=1), photo_split, tmp_path / "cache", progress=False)
    assert not b.reused and b.folder != a.folder
    assert not torch.equal(a(0), b(0))
    c = FeatureCache.open_or_build(frozen_model(seed=0, grid=7), photo_split, tmp_path / "cache", progress=False)
    assert not c.reused and c.meta["shape"] == [49, 320] and c.bytes_per_image == 49 * 320 * 2


def test_cache_rebuilt_when_image_list_or_file_changes(photo_split, tmp_path):
    model = frozen_model()
    full = FeatureCache.open_or_build(model, photo_split, tmp_path / "cache", progress=False)
    photo_split.records = photo_split.records[:2]
    fewer = FeatureCache.open_or_build(model, photo_split, tmp_path / "cache", progress=False)
    assert not fewer.reused and len(fewer) == 2 and fewer.folder != full.folder
    # Same list, but one image replaced by another picture: size and modification time change.
    path = photo_split.image_paths[0]
    shutil.copyfile(photo_split.image_paths[1], path)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    replaced = FeatureCache.open_or_build(model, photo_split, tmp_path / "cache", progress=False)
    assert not replaced.reused and replaced.folder != fewer.folder
    torch.testing.assert_close(replaced(0), replaced(1))


def test_damaged_cache_is_rebuilt_not_used(photo_split, tmp_path):
    model = frozen_model()
    first = FeatureCache.open_or_build(model, photo_split, tmp_path / "cache", progress=False)
    shard = first.folder / first.meta["shards"][0]
    expected = first(2).clone()
    del first
    np.save(shard, np.zeros((1, 196, 112), np.float16))  # truncated shard, meta.json still says 3 rows
    again = FeatureCache.open_or_build(model, photo_split, tmp_path / "cache", progress=False)
    assert not again.reused and len(again) == 3
    torch.testing.assert_close(again(2), expected)


def test_fingerprint_covers_preprocessing(photo_split):
    from dataclasses import replace

    model = frozen_model()
    before = fingerprint(model, photo_split.image_paths)
    model.preprocessing = replace(model.preprocessing, size=192)
    assert fingerprint(model, photo_split.image_paths) != before


@pytest.mark.parametrize("failure", ["unreadable", "interrupt"])
def test_failed_build_leaves_no_partial_shard(photo_split, tmp_path, monkeypatch, failure):
    """The 2nd image fails (a file Pillow cannot read, or Ctrl-C while loading it): the 1st image's row was already
    in the shard, yet nothing but the (empty) lock file is left in the cache folder, and a later build works."""
    from captioner.data.karpathy import ImageFileLoader
    from captioner.errors import ImageError

    model = frozen_model()
    second = photo_split.image_paths[1]
    original = second.read_bytes()
    if failure == "unreadable":
        second.write_bytes(b"<svg xmlns='http://www.w3.org/2000/svg'/>")
        expected = ImageError
    else:
        load = ImageFileLoader.__call__

        def interrupted(self, index):
            if index == 1:
                raise KeyboardInterrupt
            return load(self, index)

        monkeypatch.setattr(ImageFileLoader, "__call__", interrupted)
        expected = KeyboardInterrupt
    cache_dir = tmp_path / "cache"
    with pytest.raises(expected):
        FeatureCache.open_or_build(model, photo_split, cache_dir, batch_size=1, progress=False)
    left = sorted(cache_dir.iterdir())
    assert [p.suffix for p in left] == [".lock"] and left[0].stat().st_size == 0
    monkeypatch.undo()
    second.write_bytes(original)
    assert len(FeatureCache.open_or_build(model, photo_split, cache_dir, progress=False)) == 3
