"""Caption metrics on cases whose scores are known by hand."""

import numpy as np
import pytest

from captioner.evaluation.metrics import attention_entropy, coco_scores, nltk_bleu4
from captioner.scenes.metrics import attention_correctness, object_counts, object_prf

REFS = [["a red circle and a blue square"], ["two small green stars"]]


def test_identical_captions_score_the_maximum():
    scores = coco_scores(REFS, ["a red circle and a blue square", "two small green stars"], meteor=False)
    for n in range(1, 5):
        assert scores[f"BLEU-{n}"] == pytest.approx(1.0, abs=1e-6)
    assert scores["ROUGE-L"] == pytest.approx(1.0)
    assert scores["CIDEr-D"] == pytest.approx(10.0)  # cosine 1, no length penalty, times CIDEr-D's 10
    assert "METEOR" not in scores


def test_disjoint_captions_score_zero():
    scores = coco_scores(REFS, ["the yellow hexagon", "one big cross on white"], meteor=False)
    assert scores["CIDEr-D"] == 0.0 and scores["ROUGE-L"] == 0.0
    assert all(scores[f"BLEU-{n}"] < 1e-9 for n in range(1, 5))  # COCO BLEU's smoothing leaves ~1e-16
    assert nltk_bleu4(REFS, ["the yellow hexagon", "one big cross on white"]) == 0.0


def test_empty_candidate_is_scored_not_crashed():
    scores = coco_scores(REFS, ["", "two small green stars"], meteor=False)
    assert 0.0 < scores["CIDEr-D"] < 10.0


@pytest.mark.parametrize("candidates", [
    ["a red circle and a small blue square", "two green stars on a white background"],
    ["a red circle and blue square", "two green stars on white background"],  # shorter: brevity penalty
])
def test_nltk_bleu4_agrees_with_coco(candidates):
    refs = [["a red circle and a blue square", "a big red circle and a small blue square"],
            ["two small green stars on a white background"]]
    coco = coco_scores(refs, candidates, meteor=False)["BLEU-4"]
    assert 0.1 < coco < 1.0
    assert nltk_bleu4(refs, candidates) == pytest.approx(coco, abs=1e-6)


@pytest.mark.integration
def test_meteor_runs():
    """METEOR starts Java (~15 s): one test only."""
    scores = coco_scores(REFS, ["a red circle and a blue square", "two small green stars"], meteor=True)
    assert 0.9 < scores["METEOR"] <= 1.0


def obj(size, color, shape, bbox=(0, 0, 10, 10)):
    return {"size": size, "color": color, "shape": shape, "bbox": list(bbox)}


def test_object_counts_read_number_words_and_synonyms():
    counts = object_counts("there are two small red circles a big blue box and three little green stars".split())
    assert counts == {("small", "red", "circle"): 2, ("large", "blue", "square"): 1, ("small", "green", "star"): 3}
    assert object_counts("a red circle".split()) == {}  # no size word: not a full noun phrase


def test_object_prf_hand_computed():
    scenes = [[obj("small", "red", "circle"), obj("small", "red", "circle"), obj("small", "blue", "square")],
              [obj("large", "green", "star"), obj("large", "green", "star")]]
    generated = ["two small red circles and a large blue square".split(),  # 2 right, 1 wrong; misses the square
                 "three big green stars".split()]  # 2 of 3 right (the scene has two)
    # predicted 3 + 3 = 6, true 3 + 2 = 5, matched 2 + 2 = 4
    prf = object_prf(generated, scenes)
    assert prf["object_precision"] == pytest.approx(4 / 6)
    assert prf["object_recall"] == pytest.approx(4 / 5)
    assert prf["object_f1"] == pytest.approx(2 * (4 / 6) * (4 / 5) / (4 / 6 + 4 / 5))


def test_object_prf_perfect_and_empty():
    scenes = [[obj("small", "red", "circle"), obj("small", "red", "circle")]]
    assert object_prf([["two", "little", "red", "discs"]], scenes) == {
        "object_precision": 1.0, "object_recall": 1.0, "object_f1": 1.0}
    assert object_prf([["nothing"]], scenes) == {"object_precision": 0.0, "object_recall": 0.0, "object_f1": 0.0}


def test_attention_correctness_concentrated_and_uniform():
    # A 224 px image, 7x7 grid (32 px cells). Cell (3, 3) spans 96..128 px; bilinear upsampling spreads its mass
    # to 80..144 px, all inside the box 64..160 px.
    scene = [obj("small", "red", "circle", (64, 64, 160, 160))]
    tokens = ["a", "small", "red", "circle"]
    peak = np.zeros((4, 7, 7), np.float32)
    peak[:, 3, 3] = 1.0
    uniform = np.full((4, 7, 7), 1 / 49, np.float32)
    box_share = (96 * 96) / (224 * 224)

    sharp = attention_correctness([tokens], [peak], [scene])
    assert sharp["attention_correctness"] == pytest.approx(1.0, abs=1e-6)
    assert sharp["attention_words"] == 3  # size, colour and shape words
    assert sharp["attention_uniform"] == pytest.approx(box_share)
    assert sharp["attention_ratio"] == pytest.approx(1.0 / box_share, rel=1e-5)

    flat = attention_correctness([tokens], [uniform], [scene])
    assert flat["attention_correctness"] == pytest.approx(box_share, abs=1e-5)
    assert flat["attention_ratio"] == pytest.approx(1.0, abs=1e-4)

    outside = np.zeros((4, 7, 7), np.float32)
    outside[:, 0, 6] = 1.0  # the top-right corner, far from the box
    assert attention_correctness([tokens], [outside], [scene])["attention_correctness"] == pytest.approx(0.0)


def test_attention_correctness_ignores_objects_not_in_the_scene():
    scene = [obj("small", "red", "circle", (64, 64, 160, 160))]
    out = attention_correctness([["a", "large", "blue", "star"]], [np.full((4, 7, 7), 1 / 49)], [scene])
    assert out["attention_words"] == 0


def test_attention_entropy():
    assert attention_entropy([np.full((2, 3, 3), 1 / 9)]) == pytest.approx(np.log(9))
    one_hot = np.zeros((1, 3, 3))
    one_hot[0, 1, 1] = 1.0
    assert attention_entropy([one_hot]) == pytest.approx(0.0, abs=1e-9)


def test_attention_entropy_skips_empty_captions():
    """A caption of no words (an untrained model's first epoch) crashed the end-of-training test scoring."""
    empty = np.zeros((0, 3, 3))
    assert attention_entropy([empty, np.full((2, 3, 3), 1 / 9)]) == pytest.approx(np.log(9))
    assert attention_entropy([empty]) == 0.0


def test_meteor_is_skipped_with_a_warning_without_java(monkeypatch):
    """Without Java, METEOR used to crash at the very end of training (AttributeError: no attribute 'lock')."""
    import shutil

    from captioner.evaluation.metrics import coco_scores

    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "java" else real_which(name, *a, **k))
    with pytest.warns(UserWarning, match="METEOR skipped"):
        scores = coco_scores([["a red circle", "a red disc"]], ["a red circle"], meteor=True)
    assert "METEOR" not in scores and scores["BLEU-1"] > 0


def test_photo_epochs_report_no_scene_metrics(tmp_path):
    """Photos have no objects: no 'object F1 nan' in the epoch line and no empty objects/attention panel."""
    import json

    from captioner.training.report import epoch_line, plot_curves

    photo = {"CIDEr-D": 0.4, "BLEU-4": 0.2, "attention_entropy": 3.0}
    scenes = {**photo, "object_f1": 0.9, "count_accuracy": 0.8, "attention_ratio": 5.0}
    train = {"loss": 3.0, "ce": 2.9}
    line = epoch_line(1, train, photo, "CIDEr-D", 1.0, True)
    assert "nan" not in line and "object" not in line and "count" not in line and "attention" not in line
    assert "object F1 0.900  count accuracy 0.800" in epoch_line(1, train, scenes, "CIDEr-D", 1.0, True)
    for val, has_panel in ((photo, False), (scenes, True)):
        path = tmp_path / "metrics.jsonl"
        path.write_text("".join(json.dumps({"epoch": e, "train": train, "val": val}) + "\n" for e in (1, 2)))
        titles = plot_curves(path, tmp_path / "curves.png")
        assert ("objects and attention" in titles) == has_panel and (tmp_path / "curves.png").is_file()


def test_the_loss_panel_plots_the_total_the_console_prints_and_each_part(tmp_path):
    """curves.png's training-loss panel: the total ("loss", what the epoch line prints) first, then each logged part
    by name; speed and SCST reward are not losses."""
    import json
    import math

    from captioner.training.report import LOSS_LABELS, loss_series, plot_curves

    rows = [{"epoch": 1, "train": {"ce": 2.0, "ds": 9.0, "loss": 11.0, "captions_per_s": 900.0,
                                   "train_seconds": 3.0}, "val": {"CIDEr-D": 0.1}},
            {"epoch": 2, "train": {"loss": 0.5, "reward": 0.3, "sample_words": 4.0}, "val": {"CIDEr-D": 0.2}}]
    series = loss_series(rows)
    assert list(series) == [LOSS_LABELS["loss"], LOSS_LABELS["ce"], LOSS_LABELS["ds"]]
    assert series[LOSS_LABELS["loss"]] == [11.0, 0.5] and math.isnan(series[LOSS_LABELS["ds"]][1])
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot_curves(path, tmp_path / "curves.png")[0] == "training loss" and (tmp_path / "curves.png").is_file()
