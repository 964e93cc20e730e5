"""Training as a library call: ``fit(TrainConfig(...))``.

``config`` (TrainConfig, its checks, recipes), ``flags`` (command-line flags <-> settings), ``auto_recipe``
(settings chosen from the data when no recipe names the dataset), ``fit`` (the run),
``loops`` (cross-entropy and SCST epochs around one optimiser step, reading one ``LoopSettings``), ``inputs`` (splits, caches,
rewards), ``run_state`` (RNG, signals, resumable state in ``last/``, run-folder compatibility), ``report``
(metrics.jsonl, curves, console lines).
"""

from captioner.training.config import TrainConfig
from captioner.training.loops import (EpochTotals, LoopSettings, Precision, make_caption_loader, optimiser_step,
                                      train_one_epoch, train_scst_epoch)
from captioner.training.report import append_jsonl, plot_curves


def fit(cfg: TrainConfig):
    """See ``captioner.training.fit.fit`` (imported lazily: it pulls in the data and checkpoint modules)."""
    from captioner.training.fit import fit as _fit

    return _fit(cfg)


__all__ = ["TrainConfig", "fit", "make_caption_loader", "train_one_epoch", "train_scst_epoch", "LoopSettings",
           "optimiser_step", "Precision", "EpochTotals", "append_jsonl", "plot_curves"]
