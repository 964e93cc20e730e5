import os
import random

import numpy as np
import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# One torch thread in the tests and in the scripts they start (OMP_NUM_THREADS; a test that passes --threads or
# sets the variable itself keeps its own): the tests' models are tiny, so a second thread saves little, and on
# a shared 2-core machine OpenMP threads that wait for each other at every op while other processes hold the
# cores made small tests 10 to 15 times slower (tests/test_beam.py, test_repeat_penalty.py and
# test_count_mask.py: 95 s with 2 threads, 6.5 s with 1, side by side on the same busy machine).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

TINY_SPLITS = {"train": 60, "val": 12, "test": 12, "test_novel": 12}


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def shapes_dir(tmp_path_factory):
    """A tiny synthetic-scenes dataset, generated once per test session."""
    from captioner.scenes.shapes import generate

    out = tmp_path_factory.mktemp("shapes")
    generate(out, seed=0, splits=TINY_SPLITS, workers=1, progress=False)
    return out


@pytest.fixture(scope="session")
def shapes_json(shapes_dir):
    return shapes_dir / "dataset_shapes.json"
