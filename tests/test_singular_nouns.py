"""Singular nouns (the scenes plug-in's singular_nouns, with number_last): the training captions write every phrase's noun in
the singular, so the number word alone says how many; the output puts the plural back from the vocabulary."""

import json
import random
from collections import Counter

import pytest
import torch

import captioner
from captioner.decoding.search import Hypothesis
from captioner.model.config import ModelConfig
from captioner.scenes.grammar import PLURALS, caption_scene
from captioner.scenes.world import sample_objects
from captioner.errors import CaptionerError, ConfigError
from captioner.model.captioner import Captioner
from captioner.scenes.plugin import NumberFirst, SceneModel, model_settings
from captioner.scenes.phrase_order import (PLACEHOLDER, number_first, number_last, plural_table, reference_order,
                                    singular_table)
from captioner.scenes.training import training_captions
from captioner.vocab import Vocabulary
from tests.test_train_cli import train


def test_the_plural_table_finds_the_scenes_plurals_and_nothing_else():
    words = ["a", "two", "to", "the", "left", "of", "is", "as", "above", "red", *PLURALS, *PLURALS.values()]
    assert plural_table(words) == PLURALS  # circle -> circles, box -> boxes, cross -> crosses, ...
    assert plural_table(["fly", "flies", "day", "days", "bus", "buses", "busts"]) == {
        "fly": "flies", "day": "days", "bus": "buses"}
    assert plural_table(["circle"]) == {}  # a plural that is not among the words is not invented


def _scene_captions(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    objects = [sample_objects(rng, "train", repeat_prob=0.5) for _ in range(n)]
    return [caption_scene(rng, o, "plain") for o in objects]


def test_captions_learnt_in_the_singular_come_back_as_the_references_on_generated_scenes():
    captions = _scene_captions(300)
    singular = singular_table([c["tokens"] for c in captions])
    plurals = {s: p for p, s in singular.items()}
    assert plurals == {s: p for s, p in PLURALS.items() if p in singular}
    plural_phrases = 0
    for caption in captions:
        tokens, refs = number_last(caption["tokens"], caption["refs"], singular)
        assert not set(tokens) & set(PLURALS.values()), tokens  # the decoder never has to say a plural
        assert refs == number_last(caption["tokens"], caption["refs"])[1]  # the same words name the same objects
        keep, words = reference_order(tokens, plurals)
        assert words == caption["tokens"]
        assert keep == number_first(tokens)
        plural_phrases += sum(w in PLURALS.values() for w in caption["tokens"])
    assert plural_phrases > 50  # the round trip was tried on plurals, not only on single objects


def test_reference_order_on_what_a_decoder_may_write():
    plurals = {"circle": "circles", "square": "squares"}
    back = lambda text: " ".join(reference_order(text.split(), plurals)[1])  # noqa: E731
    assert back("<num> red circle two and <num> blue square a") == "two red circles and a blue square"
    assert back("<num> red circles two") == "two red circles"  # already plural (never trained): left as it is
    assert back("<num> red circle and <num> blue square three") == "red circle and three blue squares"
    assert back("<num> two") == "two"  # a number with no noun before it: nothing to make plural
    assert back("two red circle") == "two red circle"  # no place-holder: the words as written
    assert reference_order("<num> red circle two".split())[1] == "two red circle".split()  # no table: no plurals


def test_the_vocabulary_keeps_the_plurals_the_decoder_is_not_trained_to_say():
    class Split:  # the part of a KarpathySplit the training captions read
        json_path = "scenes.json"

        def __init__(self, captions):
            self.records = [{"sentences": [c]} for c in captions]

        def all_tokens(self):
            return [s["tokens"] for r in self.records for s in r["sentences"]]

    def vocabulary(min_count, **settings):  # as training builds it: the captions it learns, and the extra sentences
        captions, extra = training_captions(train_split, settings, min_count)
        return captions, extra, Vocabulary.build(captions.all_tokens() + extra, min_count)

    train_split = Split(_scene_captions(300))
    singular = singular_table(train_split.all_tokens())
    decoded, extra, vocab = vocabulary(5, number_last=True, singular_nouns=True)
    assert set(singular) <= set(vocab.itos) and PLACEHOLDER in vocab.itos
    assert not set(singular) & {w for tokens in decoded.all_tokens() for w in tokens}
    without = Vocabulary.build(decoded.all_tokens(), 5)
    assert not set(singular) & set(without.itos)  # only the extra sentences keep them
    assert {w for sentence in extra for w in sentence} <= set(singular)
    rare = Counter(w for tokens in train_split.all_tokens() for w in tokens)
    _, _, many = vocabulary(max(rare[p] for p in singular) + 1, number_last=True, singular_nouns=True)
    kept = [p for p, s in singular.items() if s in many.stoi]
    assert kept and set(kept) <= set(many.itos)  # a plural rarer than the threshold still comes with its noun
    # number_last alone: the plurals are the decoder's own words, nothing extra; neither: the captions as they are
    plain, extra, _ = vocabulary(5, number_last=True)
    assert extra == [] and set(singular) & {w for tokens in plain.all_tokens() for w in tokens}
    assert PLACEHOLDER in {w for tokens in plain.all_tokens() for w in tokens}
    assert training_captions(train_split, {}, 5) == (train_split, [])
    train_split.records[0]["sentences"][0] = {"tokens": ["a", "red", "circle"]}  # no per-word refs
    with pytest.raises(CaptionerError, match="refs"):
        training_captions(train_split, {"number_last": True, "singular_nouns": True}, 5)


def _model() -> Captioner:
    vocab = Vocabulary(["a", "two", "red", "circles", "circle", "and", PLACEHOLDER])
    cfg = ModelConfig(encoder="small_cnn", encoder_weights=None, grid=2, hidden_dim=8, embed_dim=8, attention_dim=8,
                      vocab_size=len(vocab), plugin="scenes",
                      plugin_config={"number_last": True, "singular_nouns": True})
    return Captioner(cfg, vocab, encoder_weights=None).eval()


def plurals(model: Captioner) -> dict[str, str] | None:
    """The plural table the model's captions are put back in the references' order with."""
    (number_first,) = [p for p in model.caption_processors if isinstance(p, NumberFirst)]
    return number_first.plurals


def test_a_singular_nouns_model_writes_plurals_for_plural_numbers():
    model = _model()
    text = f"{PLACEHOLDER} red circle two and {PLACEHOLDER} red circle a".split()
    alphas = torch.arange(len(text) * 4, dtype=torch.float32).reshape(len(text), 4)
    result = model.to_result(Hypothesis([model.vocab.stoi[w] for w in text], alphas, -1.0))
    assert result.text == "two red circles and a red circle"
    assert result.tokens[2] == "circles" and torch.equal(torch.from_numpy(result.alphas[2].ravel()), alphas[2])
    assert plurals(model) == {"circle": "circles"}


def test_singular_nouns_needs_number_last():
    with pytest.raises(ConfigError, match="singular_nouns"):
        ModelConfig.from_dict({"plugin": "scenes", "plugin_config": {"singular_nouns": True}})
    with pytest.raises(ConfigError, match="singular_nouns"):
        ModelConfig.from_dict({"plugin": "scenes", "plugin_config": {"singular_nouns": 1, "number_last": True}})
    assert SceneModel().singular_nouns is False
    older = ModelConfig.from_dict({"plugin": "scenes", "plugin_config": {"number_last": True}})  # older checkpoints
    assert model_settings(older.plugin_config).singular_nouns is False


def test_the_flag_without_number_last_is_one_clear_error(tmp_path, capsys):
    from captioner.commands.train import cli

    assert cli(["--config", "shapes-soft", "--out", str(tmp_path / "r"), "--print-config", "--singular-nouns",
                "--no-number-last"]) == 2
    assert "--singular-nouns True needs number_last" in capsys.readouterr().err


@pytest.mark.integration
def test_train_singular_nouns_end_to_end(shapes_json, tmp_path):
    """train.py --number-last --singular-nouns: the checkpoint keeps the plurals in its vocabulary, and what it
    writes reads the references' order."""
    run = tmp_path / "singular"
    result = train("--dataset", str(shapes_json), "--out", str(run), "--epochs", "1", "--test-splits", "test",
                   "--number-last", "--singular-nouns", "--no-meteor",
                   "--max-train-images", "5", "--max-caption-len", "30")  # plurals with their singulars
    assert result.returncode == 0, result.stderr[-2000:]
    model = captioner.load(run)
    assert model.cfg.plugin_config["singular_nouns"]
    assert plurals(model) == {"triangle": "triangles", "hexagon": "hexagons"}
    captions = json.loads((run / "results_test.json").read_text())["captions"]
    assert captions and all(PLACEHOLDER not in c["caption"].split() for c in captions)
