"""Counting with attention (captioner.scenes.count_attention): a plural whose number word's attention lies on one place is said
as one; off by default, a decoding setting, applied before merge_repeats."""

import numpy as np
import pytest
import torch

from captioner import plugins
from captioner.decoding.config import DecodingConfig
from captioner.scenes.count_attention import said_as_one, spread_beyond_peak
from captioner.errors import ConfigError
from captioner.scenes.phrase_merge import merge_repeats
from captioner.scenes.plugin import SceneDecoding, decoding_settings

GRID = 14


def blob(*centres: tuple[int, int], weights=None) -> np.ndarray:
    """(GRID, GRID) attention with a 3x3 blob of mass at each centre (row, col), normalised."""
    a = np.zeros((GRID, GRID), np.float32)
    for (r, c), w in zip(centres, weights or [1.0] * len(centres)):
        a[r - 1:r + 2, c - 1:c + 2] += w / 9
    return a / a.sum()


def maps(tokens: list[str], at: dict[int, np.ndarray]) -> np.ndarray:
    """(T, GRID, GRID): one blob top left for every word, ``at``'s maps at their positions."""
    out = np.stack([blob((2, 2))] * len(tokens))
    for i, a in at.items():
        out[i] = a
    return out


def test_the_spread_is_the_mass_beyond_two_cells_of_the_peak():
    assert spread_beyond_peak(blob((5, 5))) == pytest.approx(0.0, abs=1e-6)  # one object
    assert spread_beyond_peak(blob((3, 3), (10, 10))) == pytest.approx(0.5, abs=1e-6)  # two far apart
    assert spread_beyond_peak(blob((3, 3), (10, 10), weights=[3, 1])) == pytest.approx(0.25, abs=1e-6)
    assert spread_beyond_peak(blob((5, 5), (5, 8), weights=[2, 1])) == pytest.approx(1 / 3, abs=1e-6)  # one beside
    assert spread_beyond_peak(blob((5, 5), (5, 6), weights=[2, 1])) == pytest.approx(0.0, abs=1e-6)  # overlapping
    assert spread_beyond_peak(np.zeros((GRID, GRID))) == 0.0  # no attention: nothing beyond


def test_a_plural_that_looked_at_one_place_is_said_as_one():
    tokens = "two small red circles and a big blue box".split()
    one = said_as_one(tokens, maps(tokens, {0: blob((5, 5))}), 0.005)
    assert " ".join(one) == "a small red circle and a big blue box"
    both = said_as_one(tokens, maps(tokens, {0: blob((3, 3), (10, 10))}), 0.005)
    assert both == tokens  # it looked at two places: left as it is
    assert said_as_one(tokens, maps(tokens, {0: blob((5, 5))}), 0.0) == tokens  # off


def test_only_the_phrase_that_looked_at_one_place_changes_and_the_verb_follows():
    tokens = "there are three little green stars and two large blue crosses".split()
    looked = {2: blob((5, 5)), 7: blob((3, 3), (10, 10))}
    assert " ".join(said_as_one(tokens, maps(tokens, looked), 0.01)) == \
        "there is a little green star and two large blue crosses"
    looked = {2: blob((3, 3), (10, 10)), 7: blob((5, 5))}
    assert " ".join(said_as_one(tokens, maps(tokens, looked), 0.01)) == \
        "there are three little green stars and a large blue cross"


@pytest.mark.parametrize("caption", [
    "a small red circle and a big blue box",  # no plural
    "two dogs on the grass",  # not the scenes' words
    "",
])
def test_captions_without_a_scene_plural_are_left_as_they_are(caption):
    tokens = caption.split()
    assert said_as_one(tokens, np.zeros((len(tokens), GRID, GRID), np.float32), 0.5) == tokens


def test_maps_that_do_not_match_the_words_change_nothing():
    tokens = "two small red circles".split()
    assert said_as_one(tokens, np.stack([blob((5, 5))] * 3), 0.5) == tokens


def test_it_runs_before_the_merge_so_two_single_looks_still_make_two():
    """"two red circles" that looked at one circle, and "a red circle" that looked at the other: said as one and
    then merged, the caption counts both."""
    tokens = "two small red circles and a small red circle".split()
    single = said_as_one(tokens, maps(tokens, {0: blob((5, 5)), 5: blob((10, 10))}), 0.005)
    assert " ".join(single) == "a small red circle and a small red circle"
    assert " ".join(merge_repeats(single)[0]) == "two small red circles"


def test_the_config_holds_it_off_by_default_and_checks_it():
    assert SceneDecoding().plural_spread == 0.0
    scenes = plugins.get("scenes")
    decoding = DecodingConfig.from_dict({"plugin_settings": {"plural_spread": 0.005}}).validate(scenes)
    assert decoding_settings(decoding.plugin_settings).plural_spread == 0.005
    for bad in (-0.1, 1.5, "0.1", float("nan")):
        with pytest.raises(ConfigError, match="plural_spread"):
            DecodingConfig.from_dict({"plugin_settings": {"plural_spread": bad}}).validate(scenes)


def test_a_model_with_it_says_its_one_place_plurals_as_one():
    """The repeat-penalty tests' tiny number_last model (a 3x3 grid: every map lies within two cells of its peak) and
    a hypothesis that says "two big red circles": with plural_spread on its result says "a big red circle", with the
    same maps; set_decoding refuses a value out of range."""
    from captioner.decoding.search import Hypothesis
    from tests.test_repeat_penalty import Captioner, VOCAB, ids, model_cfg

    model = Captioner(model_cfg(), VOCAB).eval()
    words = ids("<num> big red circles two")
    hyp = Hypothesis(words, torch.full((len(words), 9), 1 / 9), -1.0)
    assert model.to_result(hyp).text == "two big red circles"
    model.set_decoding(plural_spread=0.005)
    result = model.to_result(hyp)
    assert result.text == "a big red circle" and len(result.alphas) == 4 and result.log_prob == -1.0
    with pytest.raises(ConfigError, match="plural_spread"):
        model.set_decoding(plural_spread=2.0)
    assert model.decoding.plugin_settings["plural_spread"] == 0.005
