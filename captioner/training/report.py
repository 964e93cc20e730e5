"""What a run reports: metrics.jsonl (one record per epoch), curves.png and the lines printed to the console."""

from __future__ import annotations

import json
import math
from pathlib import Path

from captioner.plugins import settings as plugin_settings

NOT_LOSSES = ("captions_per_s", "train_seconds", "reward", "sample_words")  # an epoch's train values besides losses
# the loss parts as train_one_epoch logs them (regularisers before their weights); a plug-in's own parts by name
LOSS_LABELS = {"loss": "loss: total (as printed)", "ce": "ce: cross-entropy",
               "ds": "ds: doubly stochastic (before x --lambda-ds)",
               "att": "att: attention supervision (before x --lambda-att)",
               "alpha_entropy": "alpha_entropy: attention entropy (before x --entropy-penalty)",
               "entropy": "entropy: hard attention's (a bonus, x --entropy-weight)",
               "reinforce": "reinforce: REINFORCE term (before x --reinforce-weight)"}


def append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def epoch_line(epoch: int, train: dict, val: dict, metric: str, minutes: float, improved: bool) -> str:
    """``epoch 3: loss 2.1  val CIDEr-D 0.41  object F1 0.9  count accuracy 0.8  attention 5.1x uniform  2.0 min
    (best)``; the parts after the metric are the plug-ins' summary metrics the validation data has."""
    parts = [f"epoch {epoch}: loss {train['loss']:.3f}"]
    if "reward" in train:
        parts.append(f"reward {train['reward']:.3f}")
    parts.append(f"val {metric} {val[metric]:.3f}")
    parts += [f"{label} {form.format(val[key])}" for label, key, form in plugin_settings.summary()
              if key in val and key != metric]
    parts.append(f"{minutes:.1f} min{'  (best)' if improved else ''}")
    return "  ".join(parts)


def loss_series(rows: list[dict]) -> dict[str, list[float]]:
    """Label -> one value per epoch (NaN where an epoch lacks it) of the total training loss and each part the
    epochs' ``train`` records hold, the total first."""
    keys = list(dict.fromkeys(k for r in rows for k in r["train"] if k not in NOT_LOSSES))
    keys.sort(key=lambda k: k != "loss")  # the total first, the parts in the order they were logged
    return {LOSS_LABELS.get(k, k): [r["train"].get(k, math.nan) for r in rows] for k in keys}


def plot_curves(metrics_path: Path, out_path: Path) -> list[str]:
    """Loss and validation scores per epoch, from metrics.jsonl; a third panel for a plug-in's summary metrics
    when the validation records have them. The loss panel shows the total the console prints and each logged part
    (``loss_series``). Returns the panels' titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    if not rows:
        return []
    epochs = [r["epoch"] for r in rows]
    titles = {key: m.summary_title for m in plugin_settings.manifests() for _, key, _ in m.summary}
    scene_keys = [k for k in titles if any(k in r["val"] for r in rows)]
    fig, axes = plt.subplots(1, 3 if scene_keys else 2, figsize=(13 if scene_keys else 9, 3.6))
    for label, values in loss_series(rows).items():
        axes[0].plot(epochs, values, marker="o", label=label, linewidth=2.2 if label == LOSS_LABELS["loss"] else 1.2)
    axes[0].set_title("training loss")
    if any("reward" in r["train"] for r in rows):  # self-critical epochs: the mean reward of the samples
        twin = axes[0].twinx()
        twin.plot(epochs, [r["train"].get("reward", math.nan) for r in rows], marker="s", color="tab:green",
                  label="SCST sample reward")
        twin.legend(fontsize=8, loc="upper center")
    for key in ("CIDEr-D", "BLEU-4"):
        axes[1].plot(epochs, [r["val"].get(key, math.nan) for r in rows], marker="o", label=key)
    axes[1].set_title("validation (decoded)")
    if scene_keys:
        for key in scene_keys:
            axes[2].plot(epochs, [r["val"].get(key, math.nan) for r in rows], marker="o", label=key)
        axes[2].set_title(titles[scene_keys[0]])
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=90)
    plt.close(fig)
    return [ax.get_title() for ax in axes]


def usage_lines(folder: Path) -> list[str]:
    """The commands that use a finished run's checkpoint, printed at the end of training."""
    return [f"checkpoint: {folder}",
            f"  python caption.py --checkpoint {folder} IMAGE...",
            f"  python app.py --checkpoint {folder}"]
