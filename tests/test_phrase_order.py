"""Number word last (captioner.scenes.phrase_order, the scenes plug-in's number_last): the training captions put each phrase's
number behind its noun, and the output is put back in the references' order, attention maps with it."""

import json
import random

import numpy as np
import pytest
import torch

import captioner
from captioner.decoding.search import Hypothesis
from captioner.model.config import ModelConfig
from captioner.scenes.grammar import caption_scene
from captioner.scenes.world import sample_objects
from captioner.errors import ConfigError
from captioner.model.captioner import Captioner
from captioner.scenes.phrase_order import PLACEHOLDER, number_first, number_last
from captioner.scenes.plugin import SceneModel, model_settings
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
    assert back("<num> big blue square on a plain background") == "big blue square on a plain background"


def test_a_number_last_model_writes_captions_in_the_usual_order():
    model = _number_last_model()
    vocab = model.vocab
    text = f"{PLACEHOLDER} red circles two and {PLACEHOLDER} red circle a".split()
    alphas = torch.arange(len(text) * 4, dtype=torch.float32).reshape(len(text), 4)  # row i: step i's alpha
    result = model.to_result(Hypothesis([vocab.stoi[w] for w in text], alphas, -1.0))
    assert result.text == "two red circles and a red circle"
    assert result.alphas.shape == (7, 2, 2)
    assert np.array_equal(result.alphas[0].ravel(), alphas[3].numpy())  # "two" keeps the attention that said it
    assert np.array_equal(result.alphas[1].ravel(), alphas[1].numpy())  # "red"


def _number_last_model():
    vocab = Vocabulary(["a", "two", "red", "circles", "circle", "and", PLACEHOLDER])
    cfg = ModelConfig(encoder="small_cnn", encoder_weights=None, grid=2, hidden_dim=8, embed_dim=8, attention_dim=8,
                      vocab_size=len(vocab), plugin="scenes", plugin_config={"number_last": True})
    return Captioner(cfg, vocab, encoder_weights=None).eval()


def test_the_explain_view_measures_the_words_it_shows(monkeypatch):
    """The app's per-word probabilities, gates and entropies follow the caption's order, not the decoder's."""
    import importlib

    from PIL import Image

    explain_module = importlib.import_module("captioner.serving.explain")  # the package exports its function
    model = _number_last_model()
    words = [model.vocab.stoi[w] for w in f"{PLACEHOLDER} red circles two".split()]
    real_decode = explain_module._decode_batch

    def fixed_decode(model, inputs, beam_size, weights=None, measure=False):  # no record: teacher-forced
        annotations, _ = real_decode(model, inputs, beam_size, weights)
        return annotations, [[Hypothesis(words, torch.full((4, 4), 0.25), -1.0)]]

    monkeypatch.setattr(explain_module, "_decode_batch", fixed_decode)
    picture = Image.new("RGB", (32, 32), "red")
    explanation, _ = explain_module.explain(model, picture, 1)
    assert explanation.tokens == ["two", "red", "circles"]
    inputs = model.transform(picture).unsqueeze(0)  # (1, 3, H, W)
    probs, betas, _ = explain_module._teacher_forced(model, fixed_decode(model, inputs, 1)[0], [words])[0]  # decoded
    assert explanation.word_probs == [probs[3], probs[1], probs[2]]
    assert explanation.betas == [betas[3], betas[1], betas[2]]
    assert [n["text"] for n in explanation.nbest] == ["two red circles"]


def test_scst_rewards_read_the_references_order(monkeypatch):
    """train_scst_epoch hands the reward each sample in the references' order."""
    from captioner.training.scst import Samples
    from captioner.training import loops

    model = _number_last_model().train()
    ids = [model.vocab.stoi[w] for w in f"{PLACEHOLDER} red circles two".split()] + [model.vocab.end_index]
    log_probs = torch.zeros(2, 5, requires_grad=True)

    def fixed_samples(decoder, annotations, n, *args, **kwargs):
        return Samples(torch.tensor([ids] * n), log_probs * 1.0, torch.ones(n, 5, dtype=torch.bool), None)

    seen = []

    class Recording:
        def score(self, image, tokens):
            seen.append(tokens)
            return float(len(seen))

    monkeypatch.setattr(loops, "sample_captions", fixed_samples)
    batch = {"inputs": torch.randn(1, 3, 32, 32), "image_index": torch.tensor([0])}
    optimizer = torch.optim.SGD(model.decoder.parameters(), 0.0)
    settings = loops.LoopSettings(scst_samples=2, grad_clip=1.0, max_len=8, progress=False)
    stats = loops.train_scst_epoch(model, [batch], optimizer, Recording(), settings)
    assert seen == [["two", "red", "circles"]] * 2
    assert stats["sample_words"] == 3


def test_number_last_is_a_checked_switch():
    with pytest.raises(ConfigError, match="number_last"):
        ModelConfig.from_dict({"plugin": "scenes", "plugin_config": {"number_last": "yes"}})
    assert SceneModel().number_last is False
    older = ModelConfig.from_dict({"plugin": "scenes", "plugin_config": {"count_head": True}})  # older checkpoints
    assert model_settings(older.plugin_config).number_last is False


@pytest.mark.integration
def test_train_number_last_end_to_end(shapes_json, tmp_path):
    """train.py --number-last: the vocabulary holds the place-holder, the SCST rewards and every caption written
    read the references' order."""
    run = tmp_path / "number-last"
    result = train("--dataset", str(shapes_json), "--out", str(run), "--epochs", "2", "--test-splits", "test",
                   "--number-last", "--count-head", "--scst-from", "2", "--scst-samples", "3", "--no-meteor")
    assert result.returncode == 0, result.stderr[-2000:]
    model = captioner.load(run)
    assert model.cfg.plugin_config["number_last"] and PLACEHOLDER in model.vocab.stoi
    assert "reward" in metrics_lines(run)[1]["train"]
    captions = json.loads((run / "results_test.json").read_text())["captions"]
    assert captions and all(PLACEHOLDER not in c["caption"].split() for c in captions)


def test_the_soft_recipe_says_numbers_last_and_a_flag_switches_it_off(tmp_path, capsys):
    from captioner.commands.train import cli
    from captioner.training.config import TrainConfig

    for recipe, flags, expected in (("shapes-soft", [], True), ("shapes-soft", ["--no-number-last"], False),
                                    ("shapes-hard", [], True), ("shapes-hard", ["--no-number-last"], False)):
        assert cli(["--config", recipe, "--out", str(tmp_path / "r"), "--print-config", *flags]) == 0
        path = tmp_path / "printed.toml"
        path.write_text(capsys.readouterr().out)
        printed = TrainConfig.from_recipe(path).model.plugin_config
        assert printed.get("number_last", False) is expected, (recipe, flags)
    # a plug-in's switches are --X / --no-X like the core's: the last one given wins
    assert cli(["--config", "shapes-soft", "--print-config", "--number-last", "--no-number-last"]) == 0
    assert "number_last = false" in capsys.readouterr().out
