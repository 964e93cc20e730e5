"""Scene accuracy and count accuracy on hand-made captions, and on the grammar's own references (which are right)."""

import random

import pytest

from captioner.scenes.metrics import caption_count_accuracy, parse_phrases, scene_count_metrics


def obj(size, color, shape):
    return {"size": size, "color": color, "shape": shape, "bbox": [0, 0, 10, 10]}


RED = obj("small", "red", "circle")
BOX = obj("large", "blue", "square")
STAR = obj("small", "green", "star")
HEX = obj("large", "yellow", "hexagon")


def scores(caption: str, scene: list[dict]) -> dict:
    return scene_count_metrics([caption.split()], [scene])


def test_phrases_read_number_words_plurals_and_synonyms():
    phrases = parse_phrases("one big blue box , two little red discs and a small green star".split())
    assert [(p.key, p.number, p.plural) for p in phrases] == [
        (("large", "blue", "square"), 1, False), (("small", "red", "circle"), 2, True),
        (("small", "green", "star"), 1, False)]
    assert parse_phrases("small red circles".split())[0].number is None  # no number word


@pytest.mark.parametrize("caption, scene", [
    ("one large blue square", [BOX]),
    ("a big blue box", [BOX]),
    ("two little red discs", [RED, RED]),
    ("three small green stars", [STAR] * 3),
    ("four big yellow hexagons", [HEX] * 4),
    ("there are two small red circles , a large blue square and four large yellow hexagons", [RED, BOX, HEX, RED,
                                                                                               HEX, HEX, HEX]),
])
def test_right_captions_score_one(caption, scene):
    groups = len({(o["size"], o["color"], o["shape"]) for o in scene})
    multi = len({(o["size"], o["color"], o["shape"]) for o in scene if scene.count(o) > 1})
    assert scores(caption, scene) == {"scene_accuracy": 1.0, "count_accuracy": 1.0,
                                      "count_accuracy_multi": 1.0 if multi else 0.0,
                                      "count_groups": groups, "count_groups_multi": multi}


def test_listing_a_pair_names_the_scene_but_miscounts_it():
    m = scores("a small red circle and a little red disc", [RED, RED])
    assert m["scene_accuracy"] == 1.0  # the same two objects
    assert m["count_accuracy"] == 0.0 and m["count_accuracy_multi"] == 0.0 and m["count_groups"] == 1


def test_two_for_one_is_wrong_on_both():
    m = scores("two small red circles and a large blue square", [RED, BOX])
    assert m["scene_accuracy"] == 0.0
    assert m["count_accuracy"] == pytest.approx(0.5) and m["count_groups"] == 2
    assert m["count_groups_multi"] == 0 and m["count_accuracy_multi"] == 0.0


@pytest.mark.parametrize("caption", ["three small red circles", "a small red circle", "two small red circle",
                                     "small red circles"])
def test_wrong_number_or_noun_form_miscounts_a_pair(caption):
    m = scores(caption, [RED, RED])
    assert m["count_accuracy"] == 0.0 and m["count_groups"] == 1 and m["count_groups_multi"] == 1


def test_missing_and_invented_objects():
    missing = scores("two small red circles", [RED, RED, BOX])
    assert missing["scene_accuracy"] == 0.0
    assert missing["count_accuracy"] == 1.0 and missing["count_groups"] == 1  # only named groups are counted
    invented = scores("two small red circles and a big yellow hexagon", [RED, RED])
    assert invented["scene_accuracy"] == 0.0
    assert invented["count_accuracy"] == 1.0 and invented["count_groups"] == 1  # the hexagon is object F1's concern
    wrong_attribute = scores("two big red circles", [RED, RED])  # large, not small: no group of the scene named
    assert wrong_attribute["scene_accuracy"] == 0.0 and wrong_attribute["count_groups"] == 0


def test_accuracies_pool_groups_over_captions():
    m = scene_count_metrics(["two small red circles and a big blue box".split(),  # 2 groups right
                             "a small green star and a small green star".split(),  # pair listed: wrong
                             "nothing here".split()],  # names no group
                            [[RED, RED, BOX], [STAR, STAR], [HEX]])
    assert m["scene_accuracy"] == pytest.approx(2 / 3)
    assert m["count_accuracy"] == pytest.approx(2 / 3) and m["count_groups"] == 3
    assert m["count_accuracy_multi"] == pytest.approx(1 / 2) and m["count_groups_multi"] == 2


def test_no_named_group_scores_zero():
    assert scene_count_metrics([["nothing"]], [[RED]])["count_accuracy"] == 0.0
    assert scene_count_metrics([], [])["scene_accuracy"] == 0.0
    assert caption_count_accuracy("a big blue box".split(), [RED]) == 0.0
    assert caption_count_accuracy("two small red circles and a big blue box".split(), [RED, RED, BOX]) == 1.0
    assert caption_count_accuracy("a small red circle and a big blue box".split(), [RED, RED, BOX]) == 0.5


def test_the_grammar_references_are_right():
    """Every reference the dataset's grammar writes names its scene exactly, with the right number words."""
    from captioner.scenes.grammar import caption_scene
    from captioner.scenes.world import sample_objects

    rng = random.Random(0)
    generated, scenes = [], []
    for _ in range(300):
        objects = sample_objects(rng, "train")
        for _ in range(3):
            generated.append(caption_scene(rng, objects, "plain")["tokens"])
            scenes.append([obj(o.size, o.color, o.shape) for o in objects])
    m = scene_count_metrics(generated, scenes)
    assert m["count_groups_multi"] > 50  # groups of two or more are there to be counted
    assert m["scene_accuracy"] == 1.0 and m["count_accuracy"] == 1.0 and m["count_accuracy_multi"] == 1.0


def test_group_outcomes_tell_the_count_errors_apart():
    from collections import Counter

    from captioner.scenes.metrics import group_outcomes, scene_groups
    red, blue, star = obj("small", "red", "circle"), obj("large", "blue", "square"), obj("small", "green", "star")
    scene = [red, red, blue, star]

    def outcomes(caption):
        return Counter(group_outcomes(parse_phrases(caption.split()), scene_groups(scene)))

    assert outcomes("two small red circles and a large blue square and a small green star") == \
        Counter({(2, "right"): 1, (1, "right"): 2})
    assert outcomes("a small red circle and a small red circle and two large blue squares") == \
        Counter({(2, "in several phrases"): 1, (1, "too many"): 1, (1, "left out"): 1})
    assert outcomes("a small red circle above a small green star") == \
        Counter({(2, "too few"): 1, (1, "left out"): 1, (1, "right"): 1})
    assert outcomes("two small red circle and the large blue square and a small green star") == \
        Counter({(2, "wrong form"): 1, (1, "wrong form"): 1, (1, "right"): 1})


@pytest.mark.integration
def test_count_errors_script_prints_the_table(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    red = obj("small", "red", "circle")
    (tmp_path / "dataset_shapes.json").write_text(json.dumps({"images": [
        {"filename": "a.jpg", "split": "test", "objects": [red, red]},
        {"filename": "b.jpg", "split": "test", "objects": [red]}]}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "results_test.json").write_text(json.dumps({"captions": [
        {"image": "a.jpg", "tokens": "a small red circle and a small red circle".split()},
        {"image": "b.jpg", "tokens": "a small red circle".split()}]}))
    root = Path(__file__).resolve().parent.parent
    script = [sys.executable, "-m", "experiments.count_errors"]
    r = subprocess.run([*script, str(run), "--splits", "test", "--dataset", str(tmp_path)], cwd=root,
                       capture_output=True, text=True, check=True)
    rows = [line.split(" | ") for line in r.stdout.splitlines()[2:]]
    assert rows[0][2:5] == ["1", "1", "0"] and rows[0][-2] == "1.000"  # the single red circle: right
    assert rows[1][2] == "2+" and rows[1][8] == "1" and rows[1][-2] == "0.000"  # the pair: in several phrases
    bad = subprocess.run([*script, str(run), "--splits", "val", "--dataset", str(tmp_path)], cwd=root,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "results_val.json not found" in bad.stderr and "Traceback" not in bad.stderr
