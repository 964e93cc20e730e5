import os
import random

import numpy as np
import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

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
