"""Captions steered by regions (captioner.decoding.regions): boxes onto the grid, the attention bias, the phrase-advance
state, the stop rule, and decoding with and without regions on tiny random models."""

import numpy as np
import pytest
import torch
from PIL import Image

from captioner.decoding.search import beam_search, greedy_decode
from captioner.evaluation.controllability import phrase_masses, region_cases
from captioner.model.decoder import Decoder
from captioner.plugins.extension import DecoderExtension
from tests.flat_configs import configs
from captioner.model.captioner import Captioner
from captioner.decoding.regions import (PhraseRule, RegionError, RegionGuide, RegionStop, as_region_list, mass_inside,
                               region_bias, region_weights, regions_weights)
from captioner.scenes.phrase_order import PLACEHOLDER
from captioner.scenes.regions import phrase_rule, region_metrics
from captioner.vocab import Vocabulary

VOCAB = Vocabulary([PLACEHOLDER, "a", "two", "red", "blue", "circle", "square", "and", "picture", "of"])
W = VOCAB.stoi
GRID = 4
BASE = dict(encoder="small_cnn", encoder_weights=None, grid=GRID, encoder_channels=8, hidden_dim=32, embed_dim=16,
            attention_dim=16, dropout=0.0, vocab_size=len(VOCAB), location=True, word_query=True, score="scaled_dot")


def decoder(seed: int = 0, **overrides) -> Decoder:
    torch.manual_seed(seed)
    return Decoder.build(configs(**{**BASE, **overrides})[0]).eval()


def annotations(n: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, GRID * GRID, 8, generator=torch.Generator().manual_seed(seed))  # (n, L, C)


# ------------------------------------------------------------------------------------------ boxes onto the grid

def test_a_box_covers_cells_by_the_share_of_their_area():
    # a 40x40 image on a 4x4 grid: 10 px cells; the box covers cell (0, 0) whole and half of (0, 1) and (1, 0)
    w = region_weights([0, 0, 15, 15], (GRID, GRID), (40, 40)).reshape(GRID, GRID)
    assert w[0, 0] == 1.0 and w[0, 1] == pytest.approx(0.5) and w[1, 0] == pytest.approx(0.5)
    assert w[1, 1] == pytest.approx(0.25) and w[2:].sum() == 0 and w[:, 2:].sum() == 0
    # non-square images: columns follow x, rows follow y
    w = region_weights([30, 0, 40, 5], (GRID, GRID), (40, 20)).reshape(GRID, GRID)
    assert w[0, 3] == 1.0 and w.sum() == 1.0
    # clipped to the image
    assert np.array_equal(region_weights([-50, -50, 10, 10], (GRID, GRID), (40, 40)),
                          region_weights([0, 0, 10, 10], (GRID, GRID), (40, 40)))


def test_a_mask_is_averaged_over_each_cell():
    mask = np.zeros((40, 40), bool)
    mask[:10, :5] = True  # half of cell (0, 0)
    w = region_weights(mask, (GRID, GRID), (40, 40))
    assert w[0] == pytest.approx(0.5) and w[1:].sum() == 0
    with pytest.raises(RegionError, match="size"):
        region_weights(np.ones((10, 20), bool), (GRID, GRID), (40, 40))


@pytest.mark.parametrize("box", [[0, 0, 0, 10], [5, 5, 1, 9], [50, 50, 60, 60], [0, 0, float("nan"), 4], [1, 2, 3],
                                 ["a", 0, 1, 1]])
def test_bad_boxes_are_one_clear_error(box):
    with pytest.raises(RegionError):
        region_weights(box, (GRID, GRID), (40, 40))


def test_region_lists():
    assert as_region_list([1, 2, 3, 4]) == [[1, 2, 3, 4]]
    assert as_region_list([[1, 2, 3, 4], (0, 0, 5, 5)]) == [[1, 2, 3, 4], (0, 0, 5, 5)]
    with pytest.raises(RegionError):
        as_region_list([])
    with pytest.raises(RegionError, match="between 1 and"):
        regions_weights([[0, 0, 5, 5]] * 9, (GRID, GRID), (40, 40))


def test_the_bias_is_the_weights_log_times_the_strength():
    weights = torch.tensor([[1.0, 0.5, 0.0]])
    bias = region_bias(weights, strength=2.0)
    assert bias[0, 0] == 0 and bias[0, 1] == pytest.approx(2 * np.log(0.5)) and bias[0, 2] == float("-inf")
    floored = region_bias(weights, strength=1.0, floor=1e-3)
    assert floored[0, 2] == pytest.approx(np.log(1e-3))
    # alpha = weight ** strength * exp(score), normalised
    scores = torch.tensor([[0.3, -0.2, 5.0]])
    alpha = (scores + bias).softmax(-1)
    expected = weights ** 2 * scores.exp()
    assert torch.allclose(alpha, expected / expected.sum())


# ------------------------------------------------------------------------------------------ phrases and regions

def rule() -> PhraseRule:
    return phrase_rule(W)  # number_last: <num> opens a phrase, its number word ends it


def test_the_scenes_rule_and_a_nouns_rule():
    assert rule().opener == W[PLACEHOLDER] and {W["a"], W["two"]} <= rule().closers
    plain = phrase_rule(Vocabulary(["a", "red", "circle", "squares"]).stoi)
    assert plain.opener is None and len(plain.closers) == 2  # the nouns close a phrase


def test_the_state_moves_to_the_next_region_when_a_phrase_ends():
    weights = torch.zeros(2, GRID * GRID)
    weights[0, 0], weights[1, 5] = 1.0, 1.0
    guide = RegionGuide.start([weights], rule(), len(VOCAB), strength=1.0)
    seen = []
    for word in ["<start>", "a", "picture", "of", PLACEHOLDER, "red", "circle", "a", "and", PLACEHOLDER, "blue",
                 "square", "two", "and"]:
        guide, bias = guide.after(torch.tensor([W[word]]))
        seen.append("frame" if bool((bias == 0).all()) else int(bias[0].argmax()))
    # "a picture of" (the "a" outside a phrase closes nothing) is not steered; the phrase opened by <num> looks in
    # cell 0; once its number word has ended it, the next words look in cell 5; past the last region it stays
    assert seen == ["frame", "frame", "frame", "frame", 0, 0, 0, 5, 5, 5, 5, 5, 5, 5]
    assert rule().word_regions([W[w] for w in ["a", PLACEHOLDER, "red", "a", "and", PLACEHOLDER, "two"]], 2) == \
        [-1, -1, 0, 0, 1, 1, 1]


def test_the_state_follows_rows_through_index():
    weights = [torch.eye(GRID * GRID)[:2], torch.eye(GRID * GRID)[3:4]]  # image 0: cells 0 then 1; image 1: cell 3
    guide = RegionGuide.start(weights, rule(), len(VOCAB), strength=1.0)
    assert guide.within.shape == (2, GRID * GRID) and guide.within[0, :2].tolist() == [1.0, 1.0]
    guide = guide.index(torch.tensor([0, 0, 1]))  # beams
    for word in [PLACEHOLDER, "red", "a"]:
        guide, bias = guide.after(torch.full((3,), W[word]))
    assert bias.argmax(-1).tolist() == [1, 1, 3]  # image 1 has one region: it stays there
    guide = guide.index(torch.tensor([2]))
    guide, bias = guide.after(torch.tensor([W["and"]]))
    assert int(bias.argmax()) == 3 and guide.advance(torch.zeros(1, GRID * GRID)) is guide


def test_several_regions_need_a_phrase_rule():
    with pytest.raises(RegionError, match="one\\s+region"):
        RegionGuide.start([torch.ones(2, GRID * GRID)], None, len(VOCAB))


def test_the_stop_rule():
    stop = RegionStop(rule(), 2, VOCAB.end_index)
    history = torch.tensor([[W[PLACEHOLDER], W["red"], W["a"]],  # one phrase ended
                            [W[PLACEHOLDER], W["red"], W["two"]]])
    history = torch.cat([history, torch.tensor([[W["and"], W[PLACEHOLDER], W["blue"]],
                                                [W["and"], W[PLACEHOLDER], W["a"]]])], 1)  # row 1: two ended
    logp = torch.full((2, len(VOCAB)), -2.0)
    out = stop(history, logp)
    assert out[0, VOCAB.end_index] == float("-inf") and out[0, W["red"]] == -2.0  # not yet: no <end>
    assert out[1, VOCAB.end_index] == 0.0 and (out[1] == float("-inf")).sum() == len(VOCAB) - 1  # <end>, free


def test_mass_inside_and_phrases():
    weights = np.array([[1.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    alphas = np.array([[0.5, 0.5, 0.0, 0.0], [0.2, 0.0, 0.0, 0.8], [0.0, 0.0, 0.0, 1.0]])
    masses = mass_inside(alphas, [-1, 1, 1], weights)
    assert masses == pytest.approx([0.8, 1.0])
    assert phrase_masses(masses, [-1, 1, 1]) == pytest.approx([0.9])


# ------------------------------------------------------------------------------------------ decoding

class Forbid(DecoderExtension):
    """A plug-in's own attention bias: never cell 0."""

    def start(self, annotations, decoding):
        return Rows(annotations.shape[0])

    def attention_bias(self, extra, words):
        bias = torch.zeros(words.shape[0], GRID * GRID)
        bias[:, 0] = float("-inf")
        return extra, bias


class Rows:
    def __init__(self, n):
        self.n = n

    def index(self, rows):
        return Rows(len(torch.arange(self.n)[rows]))

    def advance(self, alpha):
        return self


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_steered_attention_stays_inside_and_adds_to_the_extensions_bias(attention):
    dec = decoder(attention=attention)
    dec.extension = Forbid()
    weights = torch.zeros(1, GRID * GRID)
    weights[0, [0, 1, 4, 5]] = 1.0
    weights[0, 6] = 0.5
    for search in ("greedy", "beam"):
        guide = RegionGuide.start([weights] * 3, None, len(VOCAB), strength=1.0)
        args = (dec, annotations(), VOCAB.start_index, VOCAB.end_index)
        hyps = greedy_decode(*args, max_len=6, guide=guide) if search == "greedy" else \
            beam_search(*args, beam_size=3, max_len=6, guide=guide)
        for h in hyps:
            inside = h.alphas[:, [1, 4, 5, 6]].sum(-1)  # (T,)
            assert torch.allclose(inside, torch.ones_like(inside), atol=1e-6)  # cell 0: the extension's -inf
            assert h.alphas[:, 6].max() > 0


def test_a_region_over_the_whole_image_changes_nothing():
    """log 1 = 0 everywhere: the same words, alphas and log-probabilities as without regions, beam and greedy."""
    dec = decoder(seed=4)
    ann = annotations(3, seed=5)
    whole = [torch.ones(1, GRID * GRID)] * 3
    for beam in (1, 3):
        args = (dec, ann, VOCAB.start_index, VOCAB.end_index)
        plain = beam_search(*args, beam_size=beam, max_len=8) if beam > 1 else greedy_decode(*args, max_len=8)
        guide = RegionGuide.start(whole, None, len(VOCAB))
        steered = beam_search(*args, beam_size=beam, max_len=8, guide=guide) if beam > 1 else \
            greedy_decode(*args, max_len=8, guide=guide)
        for a, b in zip(plain, steered):
            assert a.words == b.words and torch.equal(a.alphas, b.alphas) and a.log_prob == b.log_prob


def test_batched_steered_beam_search_equals_one_image_at_a_time():
    dec = decoder(seed=3, number_last=True, lookalike=2)
    ann = annotations(4, seed=2)
    weights = [torch.rand(2, GRID * GRID, generator=torch.Generator().manual_seed(i)).round() + 0.01 for i in range(4)]
    start = lambda w: RegionGuide.start(w, rule(), len(VOCAB))  # noqa: E731
    adjust = RegionStop(rule(), 2, VOCAB.end_index)
    batched = beam_search(dec, ann, VOCAB.start_index, VOCAB.end_index, 3, 12, adjust=adjust, guide=start(weights))
    for i in range(4):
        single = beam_search(dec, ann[i:i + 1], VOCAB.start_index, VOCAB.end_index, 3, 12, adjust=adjust,
                             guide=start(weights[i:i + 1]))[0]
        assert single.words == batched[i].words
        assert single.log_prob == pytest.approx(batched[i].log_prob, abs=1e-5)


def test_the_look_alike_channels_keep_to_the_regions():
    dec = decoder(number_last=True, lookalike=2)
    ann = annotations(2)
    plain = dec.init_state(ann).annotations
    whole = RegionGuide.start([torch.ones(1, GRID * GRID)] * 2, None, len(VOCAB))
    assert torch.allclose(dec.init_state(ann, guide=whole).annotations, plain, atol=1e-5)
    corner = torch.zeros(1, GRID * GRID)
    corner[0, 0] = 1.0
    kept = dec.init_state(ann, guide=RegionGuide.start([corner] * 2, None, len(VOCAB))).annotations
    assert torch.equal(kept[..., :8], plain[..., :8]) and not torch.allclose(kept[..., -2:], plain[..., -2:])


def test_caption_with_regions_on_a_tiny_captioner(tmp_path):
    model_cfg, decoding = configs(**{**BASE, "number_last": True})
    model = Captioner(model_cfg, VOCAB, decoding=decoding).eval()
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8))
    plain = model.caption(image, max_len=8)
    assert plain.regions is None
    again = model.caption([image, image], max_len=8, regions=[None, [[0, 0, 30, 20], [30, 20, 60, 40]]])
    assert again[0].text == plain.text and np.array_equal(again[0].alphas, plain.alphas) and again[0].regions is None
    steered = again[1]
    assert len(steered.regions) == len(steered.tokens) and set(steered.regions) <= {-1, 0, 1}
    one = model.caption(image, max_len=8, regions=[0, 0, 30, 20])
    assert set(one.regions) <= {-1, 0}
    with pytest.raises(RegionError):
        model.caption([image, image], regions=[[0, 0, 5, 5]])  # one entry for two images


# ------------------------------------------------------------------------------------------ evaluation

def test_cases_and_the_scenes_measure():
    objects = [{"size": "small", "color": "red", "shape": "circle", "bbox": [0, 0, 5, 5], "group": 0},
               {"size": "large", "color": "blue", "shape": "square", "bbox": [9, 9, 20, 20], "group": 1}]
    twins = [dict(o, group=0) for o in objects]
    records = [{"objects": objects}, {"objects": twins}, {"objects": objects[:1]}, {}]
    assert [i for i, _ in region_cases(records, "one")] == [0, 1, 2]
    ordered = region_cases(records, "ordered")
    assert [i for i, _ in ordered] == [0] and sorted(o["color"] for o in ordered[0][1]) == ["blue", "red"]
    assert region_cases(records, "ordered") == ordered  # seeded
    said = ["a", "picture", "of", "a", "large", "blue", "square", "and", "a", "small", "red", "circle"]
    metrics = region_metrics([objects[::-1], objects, [objects[0]]], [said, said, ["two", "small", "red", "circles"]])
    assert metrics["regions_named"] == pytest.approx(1 / 3)  # in order / wrong order / a plural
    assert metrics["regions_colour_shape"] == pytest.approx(2 / 3)
