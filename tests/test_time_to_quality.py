"""bench/time_to_quality.py's verdict compares the unrounded test F1 with the goal: 0.9496 prints as 0.950 but is
not >= 0.95."""

import pytest

from bench import time_to_quality


def result(f1: float, budget: float = 15.0, max_test_images: int | None = None) -> dict:
    return {"recipe": "shapes-soft", "extra": "", "threads": 2, "budget_min": budget, "stopped_by_budget": True,
            "max_test_images": max_test_images,
            "run_minutes": budget, "rows": [{"epoch": 1, "minutes": 4.2, "scst": False, "val_object_f1": 0.9,
                                              "val_cider": 3.0, "best": True}],
            "test": {"images": 1000, "object_f1": f1, "CIDEr-D": 4.0, "scene_accuracy": 0.8, "count_accuracy": 0.9}}


@pytest.mark.parametrize("f1, budget, verdict", [(0.9496, 15.0, "not met"), (0.94996, 15.0, "not met"),
                                                  (0.9500, 15.0, "met"), (0.9600, 20.0, "not met")])
def test_the_goal_is_judged_unrounded(f1, budget, verdict):
    text = time_to_quality.markdown(result(f1, budget))
    assert f"minutes): {verdict} (object F1 {f1:.6f}, budget" in text


def test_part_of_the_test_split_does_not_meet_the_goal():
    text = time_to_quality.markdown(result(0.99, max_test_images=100))
    assert "minutes): not met (object F1 0.990000, budget 15 min, part of the test split)" in text
