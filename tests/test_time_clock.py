"""--time-clock: the training budget in wall seconds or in the process's CPU seconds per thread."""

import time

import pytest

from captioner.errors import CaptionerError
from captioner.training.config import TrainConfig
from captioner.training.run_state import budget_clock


def test_cpu_clock_does_not_count_waiting():
    wall, cpu = budget_clock("wall", 1), budget_clock("cpu", 1)
    w0, c0 = wall(), cpu()
    time.sleep(0.3)  # another process holding the core looks like this to us: time passes, we get no CPU
    assert wall() - w0 >= 0.29
    assert cpu() - c0 < 0.1
    c1 = cpu()
    end = time.perf_counter() + 20
    while cpu() - c1 < 0.05 and time.perf_counter() < end:  # busy: CPU time advances (by our share of a core)
        pass
    assert cpu() - c1 >= 0.05


def test_cpu_clock_is_per_thread():
    one, two = budget_clock("cpu", 1), budget_clock("cpu", 2)
    assert two() == pytest.approx(one() / 2, rel=0.05)


def test_recipe_field_is_checked():
    cfg = TrainConfig().updated({"optim": {"time_clock": "cpu"}}, "test")
    assert cfg.optim.time_clock == "cpu"
    with pytest.raises(CaptionerError, match="time_clock|time-clock"):
        TrainConfig().updated({"optim": {"time_clock": "sundial"}}, "test").validate()
