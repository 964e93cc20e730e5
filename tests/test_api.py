"""Captioner.caption() takes what people pass: one PIL image, a path (str or Path), or a list/tuple of either."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioner.model.config import ModelConfig
from captioner.decoding.config import DecodingConfig
from captioner.errors import ImageError
from captioner.model.captioner import CaptionResult, Captioner
from captioner.vocab import Vocabulary

VOCAB = Vocabulary(["a", "red", "blue", "circle", "square"])


@pytest.fixture(scope="module")
def model() -> Captioner:
    torch.manual_seed(0)
    return Captioner(ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=16, embed_dim=8,
                                 attention_dim=8), VOCAB, encoder_weights=None,
                     decoding=DecodingConfig(max_len=5)).eval()


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("pictures")
    rng = np.random.default_rng(0)
    paths = []
    for i, suffix in enumerate([".png", ".jpg", ".png"]):
        path = folder / f"p{i}{suffix}"
        Image.fromarray(rng.integers(0, 256, (30 + 7 * i, 40, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def _same(a: CaptionResult, b: CaptionResult) -> None:
    assert a.tokens == b.tokens and a.log_prob == pytest.approx(b.log_prob, abs=1e-6)


def test_one_pil_image_gives_one_result(model, pictures):
    image = Image.open(pictures[0])
    result = model.caption(image, beam_size=2)
    assert isinstance(result, CaptionResult)  # was: TypeError "object of type 'PngImageFile' has no len()"
    _same(result, model.caption([Image.open(pictures[0])], beam_size=2)[0])


@pytest.mark.parametrize("kind", [str, Path])
def test_one_path_gives_one_result(model, pictures, kind):
    result = model.caption(kind(pictures[1]), beam_size=2)
    assert isinstance(result, CaptionResult)
    _same(result, model.caption(Image.open(pictures[1]), beam_size=2))


@pytest.mark.parametrize("container", [list, tuple])
def test_a_list_of_paths_and_images_gives_a_list_in_order(model, pictures, container):
    mixed = container([str(pictures[0]), Image.open(pictures[1]), pictures[2]])
    results = model.caption(mixed, beam_size=2, batch_size=2)  # two batches: order kept across them
    assert isinstance(results, list) and len(results) == 3
    for path, result in zip(pictures, results):
        _same(result, model.caption(path, beam_size=2))


def test_empty_list(model):
    assert model.caption([]) == []


def test_paths_use_the_safe_decoder(model, tmp_path):
    """Paths go through captioner.images.open_image: a missing file or a non-image is one ImageError line."""
    with pytest.raises(ImageError, match="nowhere.png"):
        model.caption(tmp_path / "nowhere.png")
    (tmp_path / "notes.txt").write_text("not an image")
    with pytest.raises(ImageError, match="notes.txt"):
        model.caption([str(tmp_path / "notes.txt")])


def test_something_else_is_a_type_error(model):
    with pytest.raises(TypeError, match="PIL image, a path"):
        model.caption(np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(TypeError, match="ndarray"):
        model.caption([np.zeros((8, 8, 3), np.uint8)])
