"""Number word last (captioner.phrase_order, ModelConfig.number_last): the training captions put each phrase's
number behind its noun, and the output is put back in the references' order, attention maps with it."""

import json
import random

import numpy as np
import pytest
import torch

import captioner
from captioner.beam import Hypothesis
from captioner.config import ModelConfig
from captioner.data.scene_grammar import caption_scene
from captioner.data.scenes import sample_objects
from captioner.errors import ConfigError
from captioner.model import Captioner
from captioner.phrase_order import PLACEHOLDER, number_first, number_last
from captioner.vocab import Vocabulary
from tests.test_train_cli import metrics_lines, train

TOKENS = "there are two small red circles to the left of a big blue square on a shaded background".split()
REFS = [-1, -1, 0, 0, 0, 0, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1]


def test_number_last_moves_each_phrase_number_behind_its_noun():
    tokens, refs = number_last(TOKENS, REFS)
    assert tokens == ("there are <num> small red circles two to the left of <num> big blue square a on a shaded "
                      "background").split()
    assert refs == [-1, -1, 0, 0, 0, 0, 0, -1, -1, -1, -1, 1, 1, 1, 1, 1, -1, -1, -1, -1]
    assert number_last(TOKENS, None) == (TOKENS, None)  # no refs: nothing to go by


def test_number_first_inverts_it_on_generated_scenes():
    rng = random.Random(0)
    for _ in range(200):
        caption = caption_scene(rng, sample_objects(rng, "train"), "plain")
        tokens, _ = number_last(caption["tokens"], caption["refs"])
        assert PLACEHOLDER in tokens
        assert [tokens[k] for k in number_first(tokens)] == caption["tokens"]


def test_number_first_on_what_a_decoder_may_write():
    words = lambda text: text.split()  # noqa: E731
    back = lambda text: " ".join(words(text)[k] for k in number_first(words(text)))  # noqa: E731
    assert back("<num> red circle two and <num> blue square a") == "two red circle and a blue square"
    assert back("<num> red circle and <num> blue square a") == "red circle and a blue square"  # no number: dropped
    assert back("a red circle") == "a red circle"  # an ordinary caption is left alone
    assert back("<num> <num> red circle a") == "a red circle"


def test_a_number_last_model_writes_captions_in_the_usual_order():
    vocab = Vocabulary(["a", "two", "red", "circles", "circle", "and", PLACEHOLDER])
    cfg = ModelConfig(encoder="small_cnn", encoder_weights=None, grid=2, hidden_dim=8, embed_dim=8, attention_dim=8,
                      vocab_size=len(vocab), number_last=True)
    model = Captioner(cfg, vocab, encoder_weights=None)
    text = f"{PLACEHOLDER} red circles two and {PLACEHOLDER} red circle a".split()
    alphas = torch.arange(len(text) * 4, dtype=torch.float32).reshape(len(text), 4)  # row i: step i's alpha
    result = model.to_result(Hypothesis([vocab.stoi[w] for w in text], alphas, -1.0))
    assert result.text == "two red circles and a red circle"
    assert result.alphas.shape == (7, 2, 2)
    assert np.array_equal(result.alphas[0].ravel(), alphas[3].numpy())  # "two" keeps the attention that said it
    assert np.array_equal(result.alphas[1].ravel(), alphas[1].numpy())  # "red"


def test_number_last_is_a_checked_switch():
    with pytest.raises(ConfigError, match="number_last"):
        ModelConfig.from_dict({"number_last": "yes"})
    assert ModelConfig.from_dict({}).number_last is False


def test_train_number_last_end_to_end(shapes_json, tmp_path):
    """train.py --number-last: the vocabulary holds the place-holder, the SCST rewards and every caption written
    read the references' order."""
    run = tmp_path / "number-last"
    result = train("--dataset", str(shapes_json), "--out", str(run), "--epochs", "2", "--test-splits", "test",
                   "--number-last", "--count-head", "--scst-from", "2", "--scst-samples", "3", "--no-meteor")
    assert result.returncode == 0, result.stderr[-2000:]
    model = captioner.load(run)
    assert model.cfg.number_last and PLACEHOLDER in model.vocab.stoi
    assert "reward" in metrics_lines(run)[1]["train"]
    captions = json.loads((run / "results_test.json").read_text())["captions"]
    assert captions and all(PLACEHOLDER not in c["caption"].split() for c in captions)
