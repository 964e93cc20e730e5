"""experiments/list_closure.py: which captions end a list of phrases without "and", and the closing penalty it
measures."""

import pytest
import torch

from experiments.list_closure import ListClosure, unclosed


@pytest.mark.parametrize("caption, expected", [
    ("a picture of a little yellow hexagon a large green triangle", True),
    ("a large red triangle two little orange circles", True),
    ("a red circle a blue star and a green box", False),
    ("a red circle and a blue star a green box", True),  # "and" must come after the last join
    ("a red circle to the left of a blue star", False),
    ("two big red circles", False),
    ("a picture of a red circle", False),
])
def test_a_list_is_unclosed_when_its_last_join_has_no_and_after_it(caption, expected):
    assert unclosed(caption.split()) is expected


ITOS = ["<pad>", "<start>", "<end>", "<num>", "a", "two", "and", "of", "picture", "red", "blue", "circle", "star",
        "on", "to"]


def ids(words: str) -> torch.Tensor:
    return torch.tensor([[ITOS.index(w) for w in words.split()]])


def test_an_open_list_may_only_say_and_or_start_a_phrase_at_a_phrase_end():
    rule = ListClosure(ITOS, 3.0)
    logp = torch.zeros(1, len(ITOS))
    out = rule(ids("a picture of <num> red circle a <num> blue star a"), logp.clone())  # (1, V)
    allowed = {"and", "<num>"}
    for i, word in enumerate(ITOS):
        assert out[0, i] == (0.0 if word in allowed else -3.0), word


@pytest.mark.parametrize("history", [
    "a picture of <num> red circle a",  # one phrase: no list yet
    "<num> red circle a and <num> blue star a",  # closed by "and"
    "<num> red circle a <num> blue",  # inside a phrase: not at its end
])
def test_a_caption_without_an_open_list_at_a_phrase_end_is_left_alone(history):
    logp = torch.randn(1, len(ITOS))
    assert torch.equal(ListClosure(ITOS, 3.0)(ids(history), logp.clone()), logp)


def test_weight_zero_or_a_vocabulary_without_and_turns_it_off():
    assert not ListClosure(ITOS, 0.0).active
    assert not ListClosure([w for w in ITOS if w != "and"], 3.0).active
