"""captioner.training.run_warnings: each sign of a run going nowhere, from tiny made-up inputs (no training)."""

import json

from captioner.training.run_warnings import (FILENAME, RunWarnings, collapse_warning, regulariser_warning,
                                             single_reference_warning, unk_share_warning)
from captioner.vocab import Vocabulary


def test_a_small_vocabulary_with_many_unknown_words_is_named():
    sentences = [["a", "knight", "rides"], ["a", "dog", "runs"], ["a", "cat", "sleeps"]]
    vocab = Vocabulary.build(sentences, min_count=2)  # only "a" is kept
    text = unk_share_warning(sentences, vocab, 2)
    assert text is not None and text.startswith("67% of the training words are <unk>")
    assert "vocabulary of 1 words with --min-word-count 2" in text and text.endswith("lower --min-word-count")


def test_single_reference_splits_are_named():
    text = single_reference_warning("val", [1, 1, 1, 2])
    assert text is not None and text.startswith("val has one reference caption per image (3 of 4 images)")
    assert "lower and noisier than the published figures" in text


def test_a_collapsed_model_is_named():
    text = collapse_warning(["a <unk>"] * 9 + ["a dog"])
    assert text is not None and "2 distinct strings ('a <unk>' / 'a dog')" in text
    assert "the model says the same thing for every image: lower --min-word-count, --lambda-ds" in text
    assert "--epochs, --patience" in text


def test_a_dominating_regulariser_is_named():
    text = regulariser_warning({"loss": 10.0, "ce": 0.1, "ds": 9.9, "captions_per_s": 100.0}, {"ds": 1.0})
    assert text is not None and "99% of the training loss" in text and text.endswith("lower --lambda-ds")
    att = regulariser_warning({"loss": 5.0, "ce": 0.5, "att": 0.9}, {"ds": 0.0, "att": 5.0})
    assert att is not None and att.endswith("lower --lambda-att")


def test_a_healthy_run_gives_no_warning():
    sentences = [["a", "red", "circle"], ["a", "red", "square"], ["a", "blue", "circle"]] * 5
    assert unk_share_warning(sentences, Vocabulary.build(sentences, min_count=5), 5) is None
    assert single_reference_warning("val", [5, 5, 1, 5]) is None
    assert collapse_warning(["a red circle", "a blue circle", "a red square", "a red circle", "two dogs"]) is None
    assert collapse_warning(["a dog", "a dog"]) is None  # too few images to tell
    assert regulariser_warning({"loss": 3.0, "ce": 2.5, "ds": 0.5, "captions_per_s": 9e3}, {"ds": 1.0}) is None


def test_each_kind_is_printed_once_and_every_one_kept(tmp_path, capsys):
    warnings = RunWarnings(tmp_path)
    warnings.add("collapse", "same caption", "epoch 1")
    warnings.add("collapse", "same caption", "epoch 2")
    warnings.add("unk", None, "before training")
    assert capsys.readouterr().err == "warning: same caption\n"
    assert [r["when"] for r in json.loads((tmp_path / FILENAME).read_text())] == ["epoch 1", "epoch 2"]
    assert len(RunWarnings(tmp_path, resume=True).records) == 2 and RunWarnings(tmp_path).records == []


def test_a_collapse_is_raised_only_once_it_holds_for_epochs_in_a_row(tmp_path):
    warnings = RunWarnings(tmp_path)
    collapsed = {"collapse": "same caption"}
    regulariser = {"regulariser": "lambda too big"}
    assert warnings.due(collapsed | regulariser) == regulariser  # every run's first epochs say one thing
    assert warnings.due(collapsed) == {}
    assert warnings.due({}) == {}  # it recovered: the count starts again
    assert warnings.due(collapsed) == {} and warnings.due(collapsed) == {}
    assert warnings.due(collapsed) == {"collapse": "same caption (for 3 epochs in a row)"}
