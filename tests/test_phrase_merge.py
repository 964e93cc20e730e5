"""Counting by pointing (captioner.scenes.phrase_merge): phrases naming the same object kind are said as one with their sum,
each merged word keeping the mean of its sources' attention maps; off by default, a decoding setting."""

import numpy as np
import pytest
import torch

from captioner import plugins
from captioner.decoding.config import DecodingConfig
from captioner.errors import ConfigError
from captioner.scenes.phrase_merge import mean_maps, merge_repeats
from captioner.scenes.plugin import SceneDecoding, decoding_settings
from captioner.scenes.metrics import scene_count_metrics


def merged(text: str) -> str:
    return " ".join(merge_repeats(text.split())[0])


@pytest.mark.parametrize("caption, expected", [
    ("a small red circle and a small red circle", "two small red circles"),
    ("a big red disc to the left of a large red circle", "two big red discs"),  # synonyms; the relation goes
    ("there is a little blue star and a little blue star", "there are two little blue stars"),
    ("a picture of two little orange stars a large blue star and a little orange star on a plain background",
     "a picture of three little orange stars and a large blue star on a plain background"),
    ("a small red cross a big blue box a small green star and a small red cross",
     "two small red crosses a big blue box and a small green star"),
])
def test_repeated_kinds_are_said_once_with_their_sum(caption, expected):
    assert merged(caption) == expected


@pytest.mark.parametrize("caption", [
    "a small red circle and a big blue box",  # nothing repeats
    "a small red circle to the left of a big red circle",  # another size: another kind
    "three small red circles and two small red circles",  # five has no number word in the scenes' grammar
    "a dog and a dog on the grass",  # not the scenes' words
    "",
])
def test_captions_without_a_mergeable_repeat_are_left_as_they_are(caption):
    words, sources = merge_repeats(caption.split())
    assert words == caption.split() and sources == [[i] for i in range(len(words))]


def test_a_merged_word_keeps_the_mean_of_its_sources_maps():
    tokens = "a small red circle and a small red circle".split()
    words, sources = merge_repeats(tokens)
    assert sources == [[0, 5], [1, 6], [2, 7], [3, 8]]
    alphas = np.zeros((len(tokens), 2, 2), np.float32)  # (T, H, W): the first phrase looks top left, the second
    alphas[:4, 0, 0] = 1.0                                # bottom right
    alphas[4:, 1, 1] = 1.0
    maps = mean_maps(alphas, sources)  # (4, H, W)
    assert maps.shape == (4, 2, 2) and np.allclose(maps.sum(axis=(1, 2)), 1.0)
    assert np.allclose(maps[0], [[0.5, 0.0], [0.0, 0.5]])  # "two" shows both copies
    three = "a small red cross a big blue box and a small red cross".split()
    _, with_and = merge_repeats(three)
    assert with_and[4] == []  # the "and" the rule adds takes the next word's map
    maps = mean_maps(np.random.default_rng(0).random((len(three), 2, 2)).astype(np.float32), with_and)
    assert np.allclose(maps[4], maps[5])


def test_object_counts_stay_and_the_count_is_said_in_one_phrase():
    scene = [{"size": "small", "color": "red", "shape": "circle"}] * 2 + \
        [{"size": "large", "color": "blue", "shape": "square"}]
    split = "a small red circle a large blue box and a small red circle".split()
    before = scene_count_metrics([split], [scene])
    after = scene_count_metrics([merge_repeats(split)[0]], [scene])
    assert before["scene_accuracy"] == after["scene_accuracy"] == 1.0  # the same multiset of objects
    assert before["count_accuracy"] == 0.5 and after["count_accuracy"] == 1.0


def test_the_config_holds_it_off_by_default_and_checks_it():
    assert SceneDecoding().merge_repeats is False
    scenes = plugins.get("scenes")
    decoding = DecodingConfig.from_dict({"plugin_settings": {"merge_repeats": True}}).validate(scenes)
    assert decoding_settings(decoding.plugin_settings).merge_repeats is True
    with pytest.raises(ConfigError, match="merge_repeats"):
        DecodingConfig.from_dict({"plugin_settings": {"merge_repeats": 1}}).validate(scenes)


def test_a_model_with_it_merges_its_captions_and_their_maps():
    """The repeat-penalty tests' tiny model fitted to say "a big red circle and a big red circle": with
    merge_repeats its result says "two big red circles", with one map per word, each the mean of the two."""
    from tests.test_repeat_penalty import repeating_model

    model, ann = repeating_model()
    raw = model.to_result(model.decode(ann[:1], beam_size=2, max_len=12)[0])
    assert raw.text == "a big red circle and a big red circle"
    model.set_decoding(merge_repeats=True)
    hyp = model.decode(ann[:1], beam_size=2, max_len=12)[0]
    result = model.to_result(hyp)
    assert result.text == "two big red circles" and len(result.alphas) == len(result.tokens) == 4
    assert np.allclose(result.alphas[0], (raw.alphas[0] + raw.alphas[5]) / 2, atol=1e-6)
    assert result.log_prob == pytest.approx(raw.log_prob)  # the same hypothesis, said another way
    assert model.decoding.plugin_settings["merge_repeats"] and torch.is_tensor(hyp.alphas)
