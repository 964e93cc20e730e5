import pytest

from captioner.errors import CheckpointError
from captioner.vocab import Vocabulary, tokenize


def test_tokenize_needs_no_data():
    assert tokenize("A Dog's ball, 2 cats!") == ["a", "dog's", "ball", "2", "cats"]


def test_typographic_apostrophes_and_quotes_are_ascii_ones():
    """A curly apostrophe keeps the word whole, as the ASCII one does (not "knight s"); curly quotes drop out."""
    for apostrophe in "\u2019\u2018\u02bc\u2032":
        assert tokenize(f"A knight{apostrophe}s horse") == ["a", "knight's", "horse"]
    assert tokenize("\u201cA\u201d \u201edog\u201d") == tokenize('"A" "dog"') == ["a", "dog"]


def test_min_count_and_specials():
    v = Vocabulary.build([["a", "b", "a"], ["a", "c", "b"]], min_count=2)
    assert v.itos[:4] == ["<pad>", "<start>", "<end>", "<unk>"]
    assert v.itos[4:] == ["a", "b"]
    assert v.encode(["a", "c"]) == [1, 4, 3, 2]


def test_round_trip(tmp_path):
    v = Vocabulary.build([["red", "circle", "above", "red", "square"]] * 5, min_count=5)
    ids = v.encode(["red", "circle", "above"])
    assert v.decode(ids) == ["red", "circle", "above"]
    assert v.decode(ids + [0, 0]) == ["red", "circle", "above"]
    v.save(tmp_path / "vocab.json")
    assert Vocabulary.load(tmp_path / "vocab.json") == v


def test_load_rejects_foreign_file(tmp_path):
    (tmp_path / "v.json").write_text('{"itos": ["x", "y"]}')
    with pytest.raises(CheckpointError):
        Vocabulary.load(tmp_path / "v.json")
    (tmp_path / "w.json").write_text("not json")
    with pytest.raises(CheckpointError):
        Vocabulary.load(tmp_path / "w.json")
