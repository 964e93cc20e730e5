"""``fit(cfg)``: data -> vocabulary -> model (new, or the checkpoint's on resume) -> epochs -> early stop ->
final scoring. The one training entry point; ``train.py`` only turns flags into a ``TrainConfig``."""

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


def loop_settings(cfg: TrainConfig, model: Captioner, precision: Precision | None, progress: bool) -> LoopSettings:
    """What both training loops read of ``cfg``, the model's plug-in and the process, built once."""
    o, plugin = cfg.optim, model.cfg.plugin_module()
    return LoopSettings(grad_clip=o.grad_clip, precision=precision, progress=progress,
                        sample_prob=cfg.hard.sample_prob, lambda_ds=o.lambda_ds, entropy_penalty=o.entropy_penalty,
                        lambda_att=o.lambda_att, att_kind=o.att_loss,
                        plugin_losses=_plugin_losses(model, cfg.plugin), scst_samples=cfg.scst.samples,
                        max_len=cfg.data.max_caption_len,
                        as_decoded=plugin is not None and plugin.samples_as_decoded(cfg.plugin))


def fit(cfg: TrainConfig) -> FitResult:
    """Train as ``cfg`` says and return where the result is. Raises ``CaptionerError`` for bad settings or data."""
    cfg.validate()
    o, e, r = cfg.optim, cfg.eval, cfg.run
    if r.threads:
        torch.set_num_threads(r.threads)
    env = distributed.setup(r.device)  # one process, or one of torchrun's (NCCL on GPUs, gloo on CPUs)
    device = str(env.device)
    precision = Precision(r.amp, env.device)
    wanted = cfg.resolved_model()
    run_state.check_run_folder(r.out, wanted, r.resume, _model_fields_given(cfg))
    seed_everything(r.seed)
    out = Path(r.out)
    if cfg.auto and env.is_main and not r.resume:
        print(cfg.auto, flush=True)
    train, val = load_splits(cfg.data)
    owner = next((m.name for m in plugin_settings.manifests() if e.metric in m.metrics), None)
    if owner is not None and val.plugin != owner:  # a plug-in's metric measures the annotations of its own data
        raise CaptionerError(f"--metric {e.metric} needs data of the {owner} plug-in (scenes with objects), which "
                             f"the val split of {val.json_path} is not; use CIDEr-D or BLEU-4.")
    last = run_state.latest_checkpoint(out) or out / "last"  # the complete folder `last` points to
    if not env.is_main:
        distributed.barrier(env)  # rank 0 fetches weights and builds feature caches first
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
        model = load(last, device=device)  # the checkpoint's config is the truth about the model
        if vocab != model.vocab:
            raise CaptionerError(f"the vocabulary of {train.json_path} does not match the checkpoint in {last}.")
        vocab = model.vocab
    else:
        if o.fine_tune_after is not None:  # frozen first; start_fine_tuning() unfreezes at that epoch
            wanted = replace(wanted, fine_tune_from=None)
        model = Captioner(wanted, vocab, encoder_weights=wanted.encoder_weights,
                          decoding=cfg.resolved_decoding()).to(device)
    asked_stage = cfg.model.fine_tune_from if o.fine_tune_after is not None else model.cfg.fine_tune_from
    cfg = replace(cfg, model=replace(model.cfg, fine_tune_from=asked_stage))  # saved: the model as built
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
    reward, scst_train = None, train  # scst_train: the scenes the self-critical epochs sample (--scst-dataset)
    if cfg.scst.start_epoch is not None:
        if env.world > 1:
            raise CaptionerError("--scst-from runs in one process: SCST samples outside DistributedDataParallel.")
        scst_train = load_scst_split(cfg, train)
        reward = make_reward(cfg.scst, scst_train, cfg.plugin)
    sampler = lambda ds: distributed.EpochSampler(  # noqa: E731
        len(ds), env.rank, env.world, r.seed, groups=ds.image_groups() if o.group_by_image else None,
        batch_size=o.batch_size)
    train_loader = make_caption_loader(captions, vocab, train_input_loader(model, train, use_cache, cfg), o.batch_size,
                                       shuffle=True, seed=r.seed, max_len=cfg.data.max_caption_len,
                                       workers=r.workers, sampler=sampler, attention_grid=attention_grid,
                                       cell_labels=cell_labels)
    val_input = input_loader(model, val, use_cache, cfg)
    scst_input = None if scst_train is train else train_input_loader(model, scst_train, use_cache, cfg)
    if env.is_main:
        distributed.barrier(env)
    optimizer = make_optimizer(model, cfg)
    hard = hard_objective(model, cfg)
    ddp_model = distributed.wrap_ddp(model, env)
    start_epoch, best, bad_epochs, elapsed, consumed, global_step = 0, -float("inf"), 0, 0.0, 0, 0
    totals = EpochTotals()
    if r.resume:
        state = run_state.load_train_state(last)
        start_epoch, best, bad_epochs, elapsed = state["epoch"], state["best"], state["bad_epochs"], state["elapsed"]
        consumed, global_step = state.get("consumed", 0), state.get("global_step", 0)
        if consumed:
            totals = EpochTotals.from_state(state.get("epoch_totals"))
            saved = out / "train_config.toml"
            if saved.is_file() and TrainConfig.from_recipe(saved).optim.group_by_image != o.group_by_image:
                raise CaptionerError(f"{last} stopped mid-epoch with group_by_image = "
                                     f"{not o.group_by_image}: another caption order would skip the wrong "
                                     f"captions; resume without --group-by-image/--no-group-by-image.")
        run_state.restore_state(env, state, optimizer, precision, hard)  # RNG last: exact at the step boundary
        if env.is_main:
            print(f"resuming {last}: epoch {start_epoch + 1}, {consumed} captions done, step {global_step}", flush=True)
    else:
        if env.world > 1:
            torch.manual_seed(r.seed + env.rank)  # own dropout stream per rank (DDP synced the weights)
        out.mkdir(parents=True, exist_ok=True)
        if env.is_main:
            (out / "metrics.jsonl").unlink(missing_ok=True)
            (out / WARNINGS_FILE).unlink(missing_ok=True)
    warned = RunWarnings(out if env.is_main else None, r.resume)
    if env.is_main:
        atomic_write(out / "train_config.toml", cfg.to_toml())
        warn_before_training(warned, cfg, captions.all_tokens() + extra, vocab, val)
    checkpointer = run_state.Checkpointer(env, out, model, optimizer, precision, hard, r.save_every, o.batch_size,
                                          global_step)
    progress = r.progress and env.is_main
    settings = loop_settings(cfg, model, precision, progress)
    epoch = start_epoch
    clock = run_state.budget_clock(o.time_clock, r.threads)  # what --time-limit counts
    for epoch in range(start_epoch, o.epochs):
        if o.time_limit and elapsed >= o.time_limit * 60:
            break
        if o.fine_tune_after is not None and epoch >= o.fine_tune_after and model.encoder.trainable_from is None:
            start_fine_tuning(model, optimizer, cfg)
            use_cache = False  # the encoder now changes: features come from images
            train_loader = make_caption_loader(captions, vocab, train_input_loader(model, train, False, cfg),
                                               o.batch_size, shuffle=True, seed=r.seed,
                                               max_len=cfg.data.max_caption_len, workers=r.workers,
                                               sampler=train_loader.sampler, attention_grid=attention_grid,
                                               cell_labels=cell_labels)
            ddp_model = distributed.wrap_ddp(model, env)  # DDP must see the newly trainable parameters
            val_input = input_loader(model, val, False, cfg)
            if scst_input is not None:
                scst_input = train_input_loader(model, scst_train, False, cfg)
            print(f"epoch {epoch + 1}: fine-tuning encoder stages {cfg.model.fine_tune_from}+ at lr "
                  f"{o.encoder_lr}", flush=True)
        done = consumed if epoch == start_epoch else 0
        if epoch != start_epoch:
            totals = EpochTotals()
        train_loader.generator.manual_seed(r.seed * 1000 + epoch)  # same data order on resume
        train_loader.sampler.set_epoch(epoch, done)  # skips what is done
        scst = cfg.scst.start_epoch is not None and epoch + 1 >= cfg.scst.start_epoch
        budget = o.time_limit * 60 - elapsed if o.time_limit else None
        t0 = clock()
        on_step = checkpointer.step_hook(epoch, done, lambda: {"best": best, "bad_epochs": bad_epochs,
                                                               "elapsed": elapsed + clock() - t0,
                                                               "epoch_totals": totals.state_dict()},
                                         deadline=t0 + budget if budget is not None else None, clock=clock)
        desc = f"epoch {epoch + 1}/{o.epochs}"
        if scst:
            if epoch + 1 == cfg.scst.start_epoch and done == 0:
                for group in optimizer.param_groups:
                    group["lr"] = cfg.scst.lr
                bad_epochs = 0  # a new objective: patience counts the self-critical epochs from here
            checkpointer.batch_size = cfg.scst.batch_size  # resume skips images, not captions, in SCST epochs
            scst_sampler = distributed.EpochSampler(len(scst_train), env.rank, env.world, r.seed)
            scst_sampler.set_epoch(epoch, done)
            load_input = scst_input if scst_input is not None else train_loader.dataset.load_input
            scst_loader = DataLoader(ImageDataset(scst_train, load_input),
                                     batch_size=cfg.scst.batch_size, sampler=scst_sampler,
                                     collate_fn=collate_images, num_workers=r.workers)
            train_stats = train_scst_epoch(model, scst_loader, optimizer, reward, settings, hard,
                                           desc=f"{desc} (scst)", on_step=on_step, totals=totals)
        else:
            train_stats = train_one_epoch(ddp_model, train_loader, optimizer, settings, hard, desc=desc,
                                          on_step=on_step, totals=totals)
        if checkpointer.stopped_by is not None:  # SIGINT/SIGTERM: last/ was saved at the step end
            if env.is_main:
                print(f"stopped; continue with --resume --out {out}", flush=True)
            return FitResult(out, best, epoch, stopped_by=checkpointer.stopped_by)
        train_stats = distributed.reduce_stats(env, train_stats)  # loss means over all ranks
        val_decoding = model.decoding.updated(beam_size=e.val_beam_size, max_len=cfg.data.max_caption_len)
        val_metrics, val_results = (evaluate_split(model, val, val_input, val_decoding, meteor=False,  # rank 0
                                                   progress=progress)
                                    if env.is_main else (None, []))
        val_metrics = distributed.broadcast(env, val_metrics)  # every rank takes the same early-stop decision
        elapsed += clock() - t0
        score = val_metrics.get(e.metric)
        if score is None:
            raise CaptionerError(f"--metric {e.metric} needs data with objects, which {val.json_path} lacks "
                                 f"(measured: {', '.join(sorted(val_metrics))}).")
        improved = score > best
        if improved:
            best, bad_epochs = score, 0
            if env.is_main:
                save_checkpoint(model, out, extra={"epoch": epoch + 1, "val": val_metrics,
                                                   "dataset": str(train.json_path)})
        else:
            bad_epochs += 1
        for group in optimizer.param_groups:
            group["lr"] *= o.lr_decay
        consumed = 0
        totals = EpochTotals()
        checkpointer.save(epoch=epoch + 1, consumed=0, best=best, bad_epochs=bad_epochs, elapsed=elapsed)  # last/
        if env.is_main:
            found = warned.due(epoch_warnings(cfg, train_stats, [res["caption"] for res in val_results]))
            append_jsonl(out / "metrics.jsonl", {"epoch": epoch + 1, "elapsed_s": round(elapsed, 1),
                                                 "train": train_stats, "val": val_metrics, "best": improved,
                                                 **({"warnings": list(found.values())} if found else {})})
            plot_curves(out / "metrics.jsonl", out / "curves.png")
            print(epoch_line(epoch + 1, train_stats, val_metrics, e.metric, elapsed / 60, improved), flush=True)
            for kind, text in found.items():
                warned.add(kind, text, f"epoch {epoch + 1}")
        scst_ahead = cfg.scst.start_epoch is not None and epoch + 1 < cfg.scst.start_epoch <= o.epochs
        if bad_epochs >= e.patience and scst_ahead:  # cross-entropy has stalled; the scheduled SCST phase still runs
            if env.is_main and bad_epochs == e.patience:
                print(f"no {e.metric} gain for {e.patience} epochs; going on to the self-critical epochs from "
                      f"epoch {cfg.scst.start_epoch}", flush=True)
        elif bad_epochs >= e.patience:
            if env.is_main:
                print(f"early stop: no {e.metric} gain for {e.patience} epochs")
            break
    result = FitResult(out, best, epoch + 1)
    if not env.is_main:
        return result  # test scoring runs on rank 0 alone
    print(f"training time {elapsed / 60:.1f} min; best val {e.metric} {best:.3f}")
    if not (out / "config.json").is_file():  # the time limit ended the run before its first epoch
        print(f"no epoch was finished: nothing to score; continue with --resume --out {out}")
        return result
    if e.domain_images:  # the best checkpoint is final: store what its training images look like
        check = fit_run_domain(out, train, val, e.domain_images, use_cache,
                               lambda m, split, cached: input_loader(m, split, cached, cfg), device)
        if check is not None and check.rough_threshold:
            warned.add("domain", f"{check.threshold_note()}; images unlike the training data may pass, and "
                                   f"like ones be flagged: a larger val split (up to --domain-images / 2) helps",
                         "after training")
    result.test = score_test_splits(cfg, out, train.json_path, use_cache, elapsed, device)
    for line in usage_lines(out):
        print(line)
    return result


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
