"""scripts/ship_checkpoint.py: a run folder becomes a checkpoint folder with card.json and MODEL_CARD.md."""

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def test_a_run_is_shipped_with_its_card(tmp_path):
    from captioner.checkpoints.folder import save_checkpoint
    from captioner.model.config import ModelConfig
    from captioner.model.domain import fit_domain
    from captioner.model.captioner import Captioner
    from captioner.vocab import Vocabulary
    from scripts.ship_checkpoint import CARD_METRICS

    run = tmp_path / "run"
    model = Captioner(ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=16, embed_dim=8,
                                  attention_dim=8), Vocabulary(["a", "red", "circle"]))
    save_checkpoint(model, run)
    g = torch.Generator().manual_seed(0)
    fit_domain(torch.randn(30, 4, generator=g), torch.randn(12, 4, generator=g), feature="mean").save(run)
    metrics = {k: 0.5 for k in CARD_METRICS} | {"count_groups": 10, "count_groups_multi": 2, "beam_size": 3,
                                                 "images": 12, "train_minutes": 1.25, "not on the card": 1.0}
    (run / "results_test.json").write_text(json.dumps({"metrics": metrics, "captions": []}))
    dest = tmp_path / "shipped"
    result = subprocess.run([sys.executable, "-m", "scripts.ship_checkpoint", "--run", str(run), "--to", str(dest),
                             "--title", "tiny", "--recipe", "shapes-soft"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert {p.name for p in dest.iterdir()} >= {"config.json", "vocab.json", "model.safetensors", "card.json",
                                                "MODEL_CARD.md"}
    card = json.loads((dest / "card.json").read_text())
    assert card["results"]["test"]["train_minutes"] == 1.25 and "not on the card" not in card["results"]["test"]
    assert card["command"] == "python train.py --config recipes/shapes-soft.toml"
    text = (dest / "MODEL_CARD.md").read_text()
    assert text.startswith("# tiny\n")
    assert "| test | 3 | 0.500 | 0.500 | 0.500 | 0.500 | 0.500 | 0.500 | 0.500 | 0.500 (10) | 0.500 (2) | " \
           "0.500 (0.500, 0.5x) | 0.50 | 1.2 |" in text
    assert card["domain"]["threshold_images"] == 12 and card["domain"]["train_images"] == 30
    assert "threshold set on 12 val images (few: the check is rough)." in text
