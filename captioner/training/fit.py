"""``fit(cfg)``: the one training entry point; ``train.py`` only turns flags into a ``TrainConfig``.

It reads in three phases: ``prepare`` (data -> vocabulary -> model, new or the checkpoint's on resume -> loaders ->
optimiser -> restored counters), ``train_epochs`` (cross-entropy, then self-critical epochs, with early stopping)
and ``finish`` (out-of-domain check, final scoring). A ``Run`` carries what the phases share."""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from captioner.training import distributed

from captioner.checkpoints import version1

from captioner.plugins import settings as plugin_settings
from captioner.checkpoints.folder import atomic_write, read_config, save_checkpoint
from captioner.checkpoints.loading import load
from captioner.data.karpathy import ImageDataset, KarpathySplit, collate_images, load_karpathy_json
from captioner.decoding.config import DecodingConfig
from captioner.errors import CaptionerError
from captioner.training.losses import HardAttentionObjective
from captioner.model.captioner import Captioner
from captioner.training import run_state
from captioner.training.config import TrainConfig
from captioner.training.domain_stats import fit_run_domain
from captioner.training.inputs import input_loader, load_scst_split, load_splits, make_reward, train_input_loader
from captioner.evaluation.evaluate import evaluate_split
from captioner.training.loops import EpochTotals, LoopSettings, Precision, make_caption_loader, train_one_epoch, \
    train_scst_epoch
from captioner.training.report import append_jsonl, epoch_line, plot_curves, usage_lines
from captioner.training.run_warnings import FILENAME as WARNINGS_FILE
from captioner.training.run_warnings import RunWarnings, collapse_warning, regulariser_warning, \
    single_reference_warning, unk_share_warning
from captioner.vocab import Vocabulary


@dataclass
class FitResult:
    out: Path  # the run folder (its top level is the best checkpoint)
    best: float  # best validation score of ``cfg.eval.metric``
    epochs: int  # epochs finished
    test: dict[str, dict] = field(default_factory=dict)  # split -> metrics of the final scoring
    stopped_by: int | None = None  # the signal that stopped training early (resume with --resume)

    @property
    def exit_code(self) -> int:
        return 0 if self.stopped_by is None else 128 + int(self.stopped_by)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def hard_objective(model: Captioner, cfg: TrainConfig) -> HardAttentionObjective | None:
    """The REINFORCE objective when the *model* has hard attention (never decided by flags)."""
    if model.cfg.attention != "hard":
        return None
    return HardAttentionObjective(cfg.hard.baseline_decay, cfg.hard.entropy_weight, cfg.hard.reinforce_weight)


def make_optimizer(model: Captioner, cfg: TrainConfig) -> torch.optim.Optimizer:
    groups = [{"params": [p for p in model.decoder.parameters() if p.requires_grad], "lr": cfg.optim.lr}]
    enc = [p for p in model.encoder.parameters() if p.requires_grad]
    if enc:  # from scratch: the decoder's rate; pretrained: the fine-tuning rate
        groups.append({"params": enc, "lr": cfg.optim.lr if model.cfg.encoder_weights is None else cfg.optim.encoder_lr})
    return torch.optim.Adam(groups)


def start_fine_tuning(model: Captioner, optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> None:
    """--fine-tune-after: unfreeze stages --fine-tune-from on, as a new optimiser group at --encoder-lr."""
    model.fine_tune(cfg.model.fine_tune_from)  # the model's config records it: the checkpoint saves the encoder
    optimizer.add_param_group({"params": [p for p in model.encoder.parameters() if p.requires_grad],
                               "lr": cfg.optim.encoder_lr})


def _model_fields_given(cfg: TrainConfig) -> set[str] | None:
    if cfg.given is None:
        return None
    given = {g.split(".", 1)[1] for g in cfg.given if g.startswith("model.")}
    declared = {s.name: s.where for s in plugin_settings.settings()}
    if any(declared.get(name) == "model" for name in given):  # a plug-in's architecture settings are one field
        given.add("plugin_config")
    given -= {*declared, *version1.DECODING_FIELDS}
    if cfg.optim.fine_tune_after is not None:
        given.discard("fine_tune_from")  # the checkpoint records it only once fine-tuning has started
    return given


def _plugin_losses(model: Captioner, settings: dict):
    """The model's plug-in's losses for ``train_one_epoch`` (None: none); ``settings``: TrainConfig.plugin."""
    plugin = model.cfg.plugin_module()
    if plugin is None:
        return None
    return lambda out, batch, targets, device: plugin.training_losses(model, out, batch, targets, settings, device)


def scored_references_per_image(cfg: TrainConfig, json_path: Path) -> dict[str, list[int]]:
    """Split name -> the number of reference captions of each image the final scoring will read
    (``eval.test_splits``, each cut to ``max_test_images``); splits the dataset lacks are left out."""
    names = [s.strip() for s in cfg.eval.test_splits.split(",") if s.strip()]
    if not names:
        return {}
    records = load_karpathy_json(json_path)
    counts = {name: [len(r["sentences"]) for r in records if r["split"] == name] for name in names}
    return {name: n[:cfg.eval.max_test_images] if cfg.eval.max_test_images is not None else n
            for name, n in counts.items() if n}


def warn_before_training(warned: RunWarnings, cfg: TrainConfig, sentences: list[list[str]], vocab: Vocabulary,
                         val: KarpathySplit) -> None:
    """The data's signs of a run going nowhere: many <unk> words, val or test splits with one reference each."""
    when = "before training"
    warned.add("unk", unk_share_warning(sentences, vocab, cfg.data.min_word_count), when)
    val_counts = [len(val.references(i)) for i in range(len(val))]
    warned.add("val_references", single_reference_warning("val", val_counts), when)
    for name, counts in scored_references_per_image(cfg, val.json_path).items():
        warned.add(f"{name}_references", single_reference_warning(name, counts), when)


def epoch_warnings(cfg: TrainConfig, train_stats: dict[str, float], val_captions: list[str]) -> dict[str, str]:
    """Kind -> text of this epoch's signs of a run going nowhere: a regulariser dominating the loss, val
    captions collapsed to one or two strings."""
    o = cfg.optim
    found = {"regulariser": regulariser_warning(train_stats, {"ds": o.lambda_ds, "att": o.lambda_att,
                                                              "alpha_entropy": o.entropy_penalty}),
             "collapse": collapse_warning(val_captions)}
    return {kind: text for kind, text in found.items() if text is not None}


# ============================================================================================ the run's state
@dataclass
class Counters:
    """Where the run stands: what ``last/`` saves and a resume restores."""
    start_epoch: int = 0  # the first epoch this session trains
    best: float = -float("inf")  # best validation score of ``cfg.eval.metric``
    bad_epochs: int = 0  # epochs since the best one
    elapsed: float = 0.0  # training seconds so far (``run_state.budget_clock``)
    consumed: int = 0  # captions (SCST: images) of the start epoch done before a mid-epoch stop
    global_step: int = 0
    totals: EpochTotals = field(default_factory=EpochTotals)  # the start epoch's sums so far


@dataclass
class Data:
    """The splits and what the loops read of them."""
    train: KarpathySplit
    val: KarpathySplit
    captions: KarpathySplit  # the training captions as the decoder learns to write them (a plug-in may rewrite)
    extra: list  # tokens a plug-in adds to the vocabulary
    vocab: Vocabulary
    scst_train: KarpathySplit  # the scenes the self-critical epochs sample (--scst-dataset); else ``train``
    reward: object | None = None  # the self-critical reward (None: no SCST epochs)


@dataclass
class Run:
    """What the phases of ``fit`` share: the settings (``cfg``, as built: its model section is the model's), the
    process, the data, the model and its optimiser, the loaders, the counters and the run folder's writers."""
    cfg: TrainConfig
    env: distributed.DistEnv
    out: Path
    last: Path  # the resumable state (``run_state.latest_checkpoint``)
    precision: Precision
    data: Data
    model: Captioner
    use_cache: bool
    attention_grid: tuple[int, int] | None
    cell_labels: object | None
    train_loader: DataLoader
    val_input: object
    scst_input: object | None  # --scst-dataset's inputs; None: the training loader's
    optimizer: torch.optim.Optimizer | None = None
    hard: HardAttentionObjective | None = None
    ddp_model: torch.nn.Module | None = None
    settings: LoopSettings | None = None
    counters: Counters = field(default_factory=Counters)
    warned: RunWarnings | None = None
    checkpointer: run_state.Checkpointer | None = None
    clock: object = time.perf_counter  # what --time-limit counts
    epoch: int = 0  # the epoch the loop is at (FitResult counts epoch + 1)

    @property
    def device(self) -> str:
        return str(self.env.device)

    def scst_epoch(self, epoch: int) -> bool:
        """Whether ``epoch`` (0-based) is self-critical: from --scst-from on."""
        return self.cfg.scst.start_epoch is not None and epoch + 1 >= self.cfg.scst.start_epoch

    def val_decoding(self) -> DecodingConfig:
        """The model's decoding settings at the validation beam size and the training captions' length."""
        return self.model.decoding.updated(beam_size=self.cfg.eval.val_beam_size,
                                           max_len=self.cfg.data.max_caption_len)


# ============================================================================================ fit
def fit(cfg: TrainConfig) -> FitResult:
    """Train as ``cfg`` says and return where the result is. Raises ``CaptionerError`` for bad settings or data.

    Three phases, as torchvision's reference scripts: ``prepare`` (data, vocabulary, model, loaders, optimiser,
    resume), ``train_epochs`` (cross-entropy epochs, then the self-critical ones from --scst-from, each validated,
    checkpointed and logged) and ``finish`` (the best checkpoint's out-of-domain check, test splits, usage).
    """
    cfg.validate()
    run = prepare(cfg)
    stopped = train_epochs(run)
    if stopped is not None:
        return stopped
    return finish(run)


# -------------------------------------------------------------------------------------------- phase 1: prepare
def prepare(cfg: TrainConfig) -> Run:
    """Everything before the first epoch: the process and its checks, the data and vocabulary, the model (new,
    or the checkpoint's on resume), the loaders (feature caches built by rank 0 first), the optimiser, the restored
    counters (or a fresh run folder), the warnings about the data and the checkpointer."""
    env, precision = _start_process(cfg)
    train, val = _load_data(cfg)
    out = Path(cfg.run.out)
    last = run_state.latest_checkpoint(out) or out / "last"  # the complete folder `last` points to
    if not env.is_main:
        distributed.barrier(env)  # rank 0 fetches weights and builds feature caches first
    data, model, cfg = _build_model(cfg, env, train, val, last)
    run = _build_loaders(cfg, env, out, last, precision, data, model)
    if env.is_main:
        distributed.barrier(env)
    run.optimizer = make_optimizer(model, cfg)
    run.hard = hard_objective(model, cfg)
    run.ddp_model = distributed.wrap_ddp(model, env)
    if cfg.run.resume:
        _resume(run)
    else:
        _start_fresh(run)
    _open_run_folder(run)
    return run


def _start_process(cfg: TrainConfig) -> tuple[distributed.DistEnv, Precision]:
    """Threads, the process group, --amp, the run folder's compatibility with the settings, the seeds."""
    r = cfg.run
    if r.threads:
        torch.set_num_threads(r.threads)
    env = distributed.setup(r.device)  # one process, or one of torchrun's (NCCL on GPUs, gloo on CPUs)
    precision = Precision(r.amp, env.device)
    run_state.check_run_folder(r.out, cfg.resolved_model(), r.resume, _model_fields_given(cfg))
    seed_everything(r.seed)
    if cfg.auto and env.is_main and not r.resume:
        print(cfg.auto, flush=True)
    return env, precision


def _load_data(cfg: TrainConfig) -> tuple[KarpathySplit, KarpathySplit]:
    """(train, val); a plug-in's --metric needs that plug-in's data."""
    train, val = load_splits(cfg.data)
    metric = cfg.eval.metric
    owner = next((m.name for m in plugin_settings.manifests() if metric in m.metrics), None)
    if owner is not None and val.plugin != owner:  # a plug-in's metric measures the annotations of its own data
        raise CaptionerError(f"--metric {metric} needs data of the {owner} plug-in (scenes with objects), which "
                             f"the val split of {val.json_path} is not; use CIDEr-D or BLEU-4.")
    return train, val


def _build_model(cfg: TrainConfig, env: distributed.DistEnv, train: KarpathySplit, val: KarpathySplit,
                 last: Path) -> tuple[Data, Captioner, TrainConfig]:
    """The vocabulary, the model (new, or the checkpoint's on resume) and the SCST reward; the config returned
    records the model as built."""
    r, o = cfg.run, cfg.optim
    wanted = cfg.resolved_model()
    saved = read_config(last)["model"] if r.resume else None  # one clear sentence if there is nothing to resume
    # the captions as the decoder learns to write them: on resume the checkpoint's plug-in settings (its config is the
    # truth), not the recipe's
    model_cfg = wanted if saved is None else replace(wanted, plugin=saved.get("plugin"),
                                                     plugin_config=saved.get("plugin_config", {}))
    plugin = model_cfg.plugin_module()
    captions, extra = (plugin.training_captions(train, model_cfg.plugin_config, cfg.data.min_word_count)
                       if plugin else (train, []))
    vocab = Vocabulary.build(captions.all_tokens() + extra, cfg.data.min_word_count)
    if r.resume:
        model = load(last, device=str(env.device))  # the checkpoint's config is the truth about the model
        if vocab != model.vocab:
            raise CaptionerError(f"the vocabulary of {train.json_path} does not match the checkpoint in {last}.")
        vocab = model.vocab
    else:
        if o.fine_tune_after is not None:  # frozen first; start_fine_tuning() unfreezes at that epoch
            wanted = replace(wanted, fine_tune_from=None)
        model = Captioner(wanted, vocab, encoder_weights=wanted.encoder_weights,
                          decoding=cfg.resolved_decoding()).to(str(env.device))
    asked_stage = cfg.model.fine_tune_from if o.fine_tune_after is not None else model.cfg.fine_tune_from
    cfg = replace(cfg, model=replace(model.cfg, fine_tune_from=asked_stage))  # saved: the model as built
    return Data(train, val, captions, extra, vocab, train), model, cfg


def _build_loaders(cfg: TrainConfig, env: distributed.DistEnv, out: Path, last: Path, precision: Precision,
                   data: Data, model: Captioner) -> Run:
    """The attention targets the losses need (checked against the data), the SCST split and reward, and the
    inputs of every split: cached features (a frozen encoder, --cache) or images."""
    o, r, train = cfg.optim, cfg.run, data.train
    frozen = model.cfg.fine_tune_from is None and model.cfg.encoder_weights is not None
    use_cache = r.cache == "on" or (r.cache == "auto" and frozen)
    if o.augment and o.fine_tune_after is None:
        use_cache = False
    attention_grid = None
    plugin = model.cfg.plugin_module()
    cell_labels = plugin.cell_labels(cfg.plugin) if plugin else None
    box_flags = (["--lambda-att"] if o.lambda_att else []) + (plugin.needs_attention_targets(cfg.plugin) if plugin
                                                              else [])
    if box_flags:
        if not any(rec.get("objects") and any("refs" in s for s in rec["sentences"]) for rec in train.records):
            raise CaptionerError(f"{'/'.join(box_flags)} need{'s' if len(box_flags) == 1 else ''} object boxes and "
                                 f"per-word refs, which {train.json_path} lacks.")
        attention_grid = model.grid
    if plugin is not None:
        plugin.check_training_data(cfg.plugin, train, env.world)
    if cell_labels is not None:
        attention_grid = model.grid
    if cfg.scst.start_epoch is not None:
        if env.world > 1:
            raise CaptionerError("--scst-from runs in one process: SCST samples outside DistributedDataParallel.")
        data.scst_train = load_scst_split(cfg, train)
        data.reward = make_reward(cfg.scst, data.scst_train, cfg.plugin)
    sampler = lambda ds: distributed.EpochSampler(  # noqa: E731
        len(ds), env.rank, env.world, r.seed, groups=ds.image_groups() if o.group_by_image else None,
        batch_size=o.batch_size)
    train_loader = _caption_loader(cfg, data, train_input_loader(model, train, use_cache, cfg), sampler,
                                   attention_grid, cell_labels)
    val_input = input_loader(model, data.val, use_cache, cfg)
    scst_input = (None if data.scst_train is train
                  else train_input_loader(model, data.scst_train, use_cache, cfg))
    return Run(cfg, env, out, last, precision, data, model, use_cache, attention_grid, cell_labels, train_loader,
               val_input, scst_input)


def _caption_loader(cfg: TrainConfig, data: Data, load_input, sampler, attention_grid, cell_labels) -> DataLoader:
    """The cross-entropy epochs' loader: the training captions, shuffled by ``sampler``."""
    return make_caption_loader(data.captions, data.vocab, load_input, cfg.optim.batch_size, shuffle=True,
                               seed=cfg.run.seed, max_len=cfg.data.max_caption_len, workers=cfg.run.workers,
                               sampler=sampler, attention_grid=attention_grid, cell_labels=cell_labels)


def _resume(run: Run) -> None:
    """The counters, optimiser, scaler, hard baseline and RNG of ``last/`` (RNG last: exact at the step
    boundary); a run stopped mid-epoch must keep its caption order."""
    cfg, last = run.cfg, run.last
    state = run_state.load_train_state(last)
    c = run.counters
    c.start_epoch, c.best, c.bad_epochs, c.elapsed = state["epoch"], state["best"], state["bad_epochs"], \
        state["elapsed"]
    c.consumed, c.global_step = state.get("consumed", 0), state.get("global_step", 0)
    if c.consumed:
        c.totals = EpochTotals.from_state(state.get("epoch_totals"))
        saved = run.out / "train_config.toml"
        group = cfg.optim.group_by_image
        if saved.is_file() and TrainConfig.from_recipe(saved).optim.group_by_image != group:
            raise CaptionerError(f"{last} stopped mid-epoch with group_by_image = {not group}: another caption "
                                 f"order would skip the wrong captions; resume without "
                                 f"--group-by-image/--no-group-by-image.")
    run_state.restore_state(run.env, state, run.optimizer, run.precision, run.hard)
    if run.env.is_main:
        print(f"resuming {last}: epoch {c.start_epoch + 1}, {c.consumed} captions done, step {c.global_step}",
              flush=True)


def _start_fresh(run: Run) -> None:
    """A new run: its own dropout stream per rank, an empty log."""
    env, out = run.env, run.out
    if env.world > 1:
        torch.manual_seed(run.cfg.run.seed + env.rank)  # own dropout stream per rank (DDP synced the weights)
    out.mkdir(parents=True, exist_ok=True)
    if env.is_main:
        (out / "metrics.jsonl").unlink(missing_ok=True)
        (out / WARNINGS_FILE).unlink(missing_ok=True)


def _open_run_folder(run: Run) -> None:
    """The warnings log, the resolved settings, the data's warnings, the checkpointer, the loops' settings."""
    cfg, env, data = run.cfg, run.env, run.data
    run.warned = RunWarnings(run.out if env.is_main else None, cfg.run.resume)
    if env.is_main:
        atomic_write(run.out / "train_config.toml", cfg.to_toml())
        warn_before_training(run.warned, cfg, data.captions.all_tokens() + data.extra, data.vocab, data.val)
    run.checkpointer = run_state.Checkpointer(env, run.out, run.model, run.optimizer, run.precision, run.hard,
                                              cfg.run.save_every, cfg.optim.batch_size, run.counters.global_step)
    run.settings = loop_settings(cfg, run.model, run.precision, cfg.run.progress and env.is_main)
    run.clock = run_state.budget_clock(cfg.optim.time_clock, cfg.run.threads)


def loop_settings(cfg: TrainConfig, model: Captioner, precision: Precision | None, progress: bool) -> LoopSettings:
    """What both training loops read of ``cfg``, the model's plug-in and the process, built once."""
    o, plugin = cfg.optim, model.cfg.plugin_module()
    return LoopSettings(grad_clip=o.grad_clip, precision=precision, progress=progress,
                        sample_prob=cfg.hard.sample_prob, lambda_ds=o.lambda_ds, entropy_penalty=o.entropy_penalty,
                        lambda_att=o.lambda_att, att_kind=o.att_loss,
                        plugin_losses=_plugin_losses(model, cfg.plugin), scst_samples=cfg.scst.samples,
                        max_len=cfg.data.max_caption_len,
                        as_decoded=plugin is not None and plugin.samples_as_decoded(cfg.plugin))


# -------------------------------------------------------------------------------------------- phase 2: epochs
def train_epochs(run: Run) -> FitResult | None:
    """The epochs: cross-entropy, then self-critical from --scst-from (at its learning rate, patience counted
    afresh), each one validated, checkpointed and logged. Ends at --epochs, the time limit, early stopping, or a
    signal (then the FitResult to return at once: ``last/`` was saved at the step end)."""
    o, c = run.cfg.optim, run.counters
    run.epoch = c.start_epoch
    for epoch in range(c.start_epoch, o.epochs):
        run.epoch = epoch
        if o.time_limit and c.elapsed >= o.time_limit * 60:
            break
        if o.fine_tune_after is not None and epoch >= o.fine_tune_after and run.model.encoder.trainable_from is None:
            _start_fine_tuning(run, epoch)
        done = c.consumed if epoch == c.start_epoch else 0
        if epoch != c.start_epoch:
            c.totals = EpochTotals()
        run.train_loader.generator.manual_seed(run.cfg.run.seed * 1000 + epoch)  # same data order on resume
        run.train_loader.sampler.set_epoch(epoch, done)  # skips what is done
        t0 = run.clock()
        on_step = _step_hook(run, epoch, done, t0)
        desc = f"epoch {epoch + 1}/{o.epochs}"
        if run.scst_epoch(epoch):
            train_stats = _scst_epoch(run, epoch, done, on_step, f"{desc} (scst)")
        else:
            train_stats = _cross_entropy_epoch(run, on_step, desc)
        if run.checkpointer.stopped_by is not None:  # SIGINT/SIGTERM: last/ was saved at the step end
            if run.env.is_main:
                print(f"stopped; continue with --resume --out {run.out}", flush=True)
            return FitResult(run.out, c.best, epoch, stopped_by=run.checkpointer.stopped_by)
        _end_epoch(run, epoch, distributed.reduce_stats(run.env, train_stats), t0)  # loss means over all ranks
        if _early_stop(run, epoch):
            break
    return None


def _start_fine_tuning(run: Run, epoch: int) -> None:
    """--fine-tune-after: unfreeze the encoder; from now on every split is read as images."""
    cfg, model, data = run.cfg, run.model, run.data
    start_fine_tuning(model, run.optimizer, cfg)
    run.use_cache = False  # the encoder now changes: features come from images
    run.train_loader = _caption_loader(cfg, data, train_input_loader(model, data.train, False, cfg),
                                       run.train_loader.sampler, run.attention_grid, run.cell_labels)
    run.ddp_model = distributed.wrap_ddp(model, run.env)  # DDP must see the newly trainable parameters
    run.val_input = input_loader(model, data.val, False, cfg)
    if run.scst_input is not None:
        run.scst_input = train_input_loader(model, data.scst_train, False, cfg)
    print(f"epoch {epoch + 1}: fine-tuning encoder stages {cfg.model.fine_tune_from}+ at lr "
          f"{cfg.optim.encoder_lr}", flush=True)


def _step_hook(run: Run, epoch: int, done: int, t0: float):
    """The loops' ``on_step``: checkpoints every --save-every steps and on a signal, stops at the time limit."""
    o, c = run.cfg.optim, run.counters
    budget = o.time_limit * 60 - c.elapsed if o.time_limit else None
    return run.checkpointer.step_hook(epoch, done, lambda: {"best": c.best, "bad_epochs": c.bad_epochs,
                                                            "elapsed": c.elapsed + run.clock() - t0,
                                                            "epoch_totals": c.totals.state_dict()},
                                      deadline=t0 + budget if budget is not None else None, clock=run.clock)


def _cross_entropy_epoch(run: Run, on_step, desc: str) -> dict[str, float]:
    """One teacher-forced epoch over the training captions (``train_loader``: ordered for this epoch)."""
    return train_one_epoch(run.ddp_model, run.train_loader, run.optimizer, run.settings, run.hard, desc=desc,
                           on_step=on_step, totals=run.counters.totals)


def _scst_epoch(run: Run, epoch: int, done: int, on_step, desc: str) -> dict[str, float]:
    """One self-critical epoch over the SCST split's images; its first epoch sets --scst-lr and restarts the
    patience count (a new objective)."""
    cfg, env, data = run.cfg, run.env, run.data
    if epoch + 1 == cfg.scst.start_epoch and done == 0:
        for group in run.optimizer.param_groups:
            group["lr"] = cfg.scst.lr
        run.counters.bad_epochs = 0  # a new objective: patience counts the self-critical epochs from here
    run.checkpointer.batch_size = cfg.scst.batch_size  # resume skips images, not captions, in SCST epochs
    sampler = distributed.EpochSampler(len(data.scst_train), env.rank, env.world, cfg.run.seed)
    sampler.set_epoch(epoch, done)
    load_input = run.scst_input if run.scst_input is not None else run.train_loader.dataset.load_input
    scst_loader = DataLoader(ImageDataset(data.scst_train, load_input), batch_size=cfg.scst.batch_size,
                             sampler=sampler, collate_fn=collate_images, num_workers=cfg.run.workers)
    return train_scst_epoch(run.model, scst_loader, run.optimizer, data.reward, run.settings, run.hard, desc=desc,
                            on_step=on_step, totals=run.counters.totals)


def _end_epoch(run: Run, epoch: int, train_stats: dict[str, float], t0: float) -> None:
    """Validate (rank 0; every rank takes the same decision), keep the best checkpoint, decay the learning rate,
    save ``last/`` and log the epoch."""
    cfg, env, c, e = run.cfg, run.env, run.counters, run.cfg.eval
    val_metrics, val_results = (evaluate_split(run.model, run.data.val, run.val_input, run.val_decoding(),
                                               meteor=False, progress=run.settings.progress)
                                if env.is_main else (None, []))
    val_metrics = distributed.broadcast(env, val_metrics)  # every rank takes the same early-stop decision
    c.elapsed += run.clock() - t0
    score = val_metrics.get(e.metric)
    if score is None:
        raise CaptionerError(f"--metric {e.metric} needs data with objects, which {run.data.val.json_path} lacks "
                             f"(measured: {', '.join(sorted(val_metrics))}).")
    improved = score > c.best
    if improved:
        c.best, c.bad_epochs = score, 0
        if env.is_main:
            save_checkpoint(run.model, run.out, extra={"epoch": epoch + 1, "val": val_metrics,
                                                       "dataset": str(run.data.train.json_path)})
    else:
        c.bad_epochs += 1
    for group in run.optimizer.param_groups:
        group["lr"] *= cfg.optim.lr_decay
    c.consumed = 0
    c.totals = EpochTotals()
    run.checkpointer.save(epoch=epoch + 1, consumed=0, best=c.best, bad_epochs=c.bad_epochs,
                          elapsed=c.elapsed)  # last/
    if env.is_main:
        _log_epoch(run, epoch, train_stats, val_metrics, [res["caption"] for res in val_results], improved)


def _log_epoch(run: Run, epoch: int, train_stats: dict, val_metrics: dict, val_captions: list[str],
               improved: bool) -> None:
    """metrics.jsonl, curves.png, the console line and the epoch's warnings."""
    out, c, metric = run.out, run.counters, run.cfg.eval.metric
    found = run.warned.due(epoch_warnings(run.cfg, train_stats, val_captions))
    append_jsonl(out / "metrics.jsonl", {"epoch": epoch + 1, "elapsed_s": round(c.elapsed, 1),
                                         "train": train_stats, "val": val_metrics, "best": improved,
                                         **({"warnings": list(found.values())} if found else {})})
    plot_curves(out / "metrics.jsonl", out / "curves.png")
    print(epoch_line(epoch + 1, train_stats, val_metrics, metric, c.elapsed / 60, improved), flush=True)
    for kind, text in found.items():
        run.warned.add(kind, text, f"epoch {epoch + 1}")


def _early_stop(run: Run, epoch: int) -> bool:
    """No gain for --patience epochs: stop, unless self-critical epochs are still ahead (then go on to them)."""
    cfg, e, bad = run.cfg, run.cfg.eval, run.counters.bad_epochs
    scst_ahead = cfg.scst.start_epoch is not None and epoch + 1 < cfg.scst.start_epoch <= cfg.optim.epochs
    if bad >= e.patience and scst_ahead:  # cross-entropy has stalled; the scheduled SCST phase still runs
        if run.env.is_main and bad == e.patience:
            print(f"no {e.metric} gain for {e.patience} epochs; going on to the self-critical epochs from "
                  f"epoch {cfg.scst.start_epoch}", flush=True)
        return False
    if bad >= e.patience:
        if run.env.is_main:
            print(f"early stop: no {e.metric} gain for {e.patience} epochs")
        return True
    return False


# -------------------------------------------------------------------------------------------- phase 3: finish
def finish(run: Run) -> FitResult:
    """After the epochs (rank 0 alone): the best checkpoint's out-of-domain check, the test splits scored with
    it, and how to use it."""
    c, e, out = run.counters, run.cfg.eval, run.out
    result = FitResult(out, c.best, run.epoch + 1)
    if not run.env.is_main:
        return result  # test scoring runs on rank 0 alone
    print(f"training time {c.elapsed / 60:.1f} min; best val {e.metric} {c.best:.3f}")
    if not (out / "config.json").is_file():  # the time limit ended the run before its first epoch
        print(f"no epoch was finished: nothing to score; continue with --resume --out {out}")
        return result
    if e.domain_images:  # the best checkpoint is final: store what its training images look like
        _fit_domain(run)
    result.test = score_test_splits(run.cfg, out, run.data.train.json_path, run.use_cache, c.elapsed, run.device)
    for line in usage_lines(out):
        print(line)
    return result


def _fit_domain(run: Run) -> None:
    """Store the training images' look with the best checkpoint (``fit_run_domain``); warn if its threshold is
    rough."""
    cfg, data = run.cfg, run.data
    check = fit_run_domain(run.out, data.train, data.val, cfg.eval.domain_images, run.use_cache,
                           lambda m, split, cached: input_loader(m, split, cached, cfg), run.device)
    if check is not None and check.rough_threshold:
        run.warned.add("domain", f"{check.threshold_note()}; images unlike the training data may pass, and "
                                 f"like ones be flagged: a larger val split (up to --domain-images / 2) helps",
                       "after training")


def score_test_splits(cfg: TrainConfig, out: Path, json_path: Path, use_cache: bool, elapsed: float,
                      device: str) -> dict[str, dict]:
    """Decode and score ``cfg.eval.test_splits`` (at most ``max_test_images`` each) with the best checkpoint."""
    from captioner.evaluation.metrics import java_available

    e = cfg.eval
    names = [s.strip() for s in e.test_splits.split(",") if s.strip()]
    if not names:
        return {}
    meteor = e.meteor and java_available()
    if e.meteor and not meteor:
        print("warning: METEOR skipped: it needs Java (`java` not found); pass --no-meteor to silence this.",
              file=sys.stderr, flush=True)
    best_model = load(out, device=device)
    decoding = best_model.decoding.updated(beam_size=e.test_beam_size, max_len=cfg.data.max_caption_len)
    scores = {}
    for name in names:
        try:
            split = KarpathySplit.load(json_path, name, cfg.data.image_root)
        except CaptionerError:
            continue  # not every dataset has test_novel
        if e.max_test_images is not None:
            split.records = split.records[:e.max_test_images]
        metrics, results = evaluate_split(best_model, split, input_loader(best_model, split, use_cache, cfg),
                                          decoding, meteor=meteor, progress=cfg.run.progress)
        metrics["beam_size"] = e.test_beam_size
        metrics["train_minutes"] = round(elapsed / 60, 2)
        atomic_write(out / f"results_{name}.json", json.dumps({"metrics": metrics, "captions": results}, indent=1))
        print(f"{name}: " + "  ".join(f"{k} {v:.3f}" for k, v in metrics.items() if isinstance(v, float)))
        scores[name] = metrics
    return scores
