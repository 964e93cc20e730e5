"""Ablation of the attention mechanism on the synthetic scenes: one training run per variant, one table.

    python bench/ablation.py                       # every variant, the default recipe with a per-run time budget
    python bench/ablation.py --variants soft,hard  # a subset
    python bench/ablation.py --group counting      # the counting ideas (issue 21), on the shipped recipes

Each variant is the default recipe (RECIPE below) with one change, trained for a short fixed time budget
(--minutes, one torch thread, --parallel at once), so the table compares choices at equal cost; the shipped
checkpoints train longer (README "Default recipe"). Runs go to
runs/ablation/<variant>; results are read back from their results_<split>.json files and printed as Markdown,
and written to bench/results/ablation.json. Rerunning skips variants whose results already exist (--force redoes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The README's default recipe with the paper's additive score (the shipped soft model uses scaled dot, found by this
# table); each variant adds or overrides flags (argparse: last one wins).
RECIPE: list[str] = ("--encoder efficientnet_lite0_ms --positional 16 --hidden-dim 256 --attention-dim 128 "
                     "--embed-dim 128 --dropout 0.3 --lr 2e-3 --lr-decay 0.85 --lambda-ds 0 --seed 0").split()
VARIANTS: dict[str, list[str]] = {
    "none (mean context)": ["--attention", "none"],
    "soft, additive": [],
    "hard, additive": ["--attention", "hard"],
    "soft, dot": ["--score", "dot"],
    "soft, scaled dot": ["--score", "scaled_dot"],
    "soft, general": ["--score", "general"],
    "soft, cosine": ["--score", "cosine"],
    "soft + channel attention": ["--channel-attention"],
    "soft + self-attention": ["--self-attention"],
    "soft + location-aware (alpha_{t-1}, coverage)": ["--location"],
    "soft + doubly stochastic (lambda 0.005)": ["--lambda-ds", "0.005"],
    "soft, no positional channels": ["--positional", "0"],
    "soft, plain lite0 features (no hypercolumn)": ["--encoder", "efficientnet_lite0"],
    "soft + word-aware query": ["--word-query"],
    "soft + supervised attention (lambda 1)": ["--lambda-att", "1"],
    "soft, scaled dot + word-aware query + supervised attention": ["--score", "scaled_dot", "--word-query",
                                                                   "--lambda-att", "1"],
    "hard, scaled dot + word-aware query + supervised attention": ["--attention", "hard", "--score", "scaled_dot",
                                                                   "--word-query", "--lambda-att", "1"],
    "hard, scaled dot + word-aware query + supervised attention (mass)": [
        "--attention", "hard", "--score", "scaled_dot", "--word-query", "--lambda-att", "1", "--att-loss", "mass"],
}

# Counting (README "Counting"): each row is a shipped recipe (--config) with one idea switched on, trained for the
# same 27 minutes of CPU time on one thread (--time-clock cpu: the budget does not shrink when runs share the cores);
# SCST starts at epoch 7 so that the self-critical phase fits the budget on a shared machine. Rows "CE only" stop
# after 4 epochs of cross-entropy (no SCST) to see what the count head changes before any reward.
_SCST = ["--scst-from", "7", "--metric", "scene_accuracy", "--time-clock", "cpu", "--time-limit", "27"]
_CE4 = ["--scst-from", "100", "--epochs", "4", "--time-clock", "cpu", "--time-limit", "1000"]
_EPOCHS15 = ["--epochs", "15", "--time-limit", "1000"]
# the same seed's scenes with the train split repeating an object with probability 0.5 instead of 0.25 (val and
# test splits byte for byte those of datasets/shapes):
#   python -m captioner.data.shapes --out datasets/shapes-repeats --train-repeat-prob 0.5
_REPEATS = ROOT / "datasets" / "shapes-repeats"
#   python -m captioner.data.shapes --out datasets/shapes-repeats35 --train-repeat-prob 0.35
_REPEATS35 = ROOT / "datasets" / "shapes-repeats35"
#   python -m captioner.data.shapes --out datasets/shapes-repeats70 --train-repeat-prob 0.7
_REPEATS70 = ROOT / "datasets" / "shapes-repeats70"
_SHAPES = ROOT / "datasets" / "shapes"  # the usual scenes (seed 0): where --scst-dataset points in session 18's rows
# the soft recipe as session 14 shipped it (objects reward, count term over named groups, 27 CPU minutes): the
# rows below were measured on it, so they pin it rather than follow the recipe file as it changes
# (--lookalike 0, --dataset shapes, --scst-dataset none: the recipe has had look-alike channels, cross-entropy on
# repeated objects and SCST on the usual scenes since session 19; --scst-from 10: SCST from epoch 9 since session 20;
# --inhibit-named 0: every row before session 25 decoded without inhibition of return, which the recipes have since;
# --length-penalty 0 --repeat-penalty 0: the same for session 26's decoding settings; --no-singular-nouns
# --no-count-head --no-scst-inhibit: the recipe has had them since session 31)
# since session 39 the soft recipe's SCST reward holds CIDEr-D (cider+objects+counts, 20 x F1 and count): every row on
# the recipe as sessions 14-38 shipped it pins the reward it was run with
_SOFT_BEFORE39 = ["--scst-reward", "objects+counts", "--scst-object-weight", "10", "--scst-count-weight", "10"]
_BEFORE31 = ["--no-singular-nouns", "--no-count-head", "--no-scst-inhibit", "--no-merge-repeats",  # the last: session 33
             *_SOFT_BEFORE39]
_SHIPPED14 = ["--config", "shapes-soft", *_BEFORE31, "--inhibit-named", "0", "--length-penalty", "0",
              "--repeat-penalty", "0", "--scst-reward", "objects", "--scst-count-over", "named", "--epochs", "40",
              "--time-limit", "27", "--time-clock", "cpu", "--lookalike", "0", "--dataset", "shapes",
              "--scst-dataset", "none", "--scst-from", "10"]
# the soft recipe as session 15 shipped it (objects+counts over the scene's groups, 15 epochs, SCST from epoch 10)
_SHIPPED15 = ["--config", "shapes-soft", *_BEFORE31, "--inhibit-named", "0", "--length-penalty", "0",
              "--repeat-penalty", "0", "--lookalike", "0", "--dataset", "shapes", "--scst-dataset", "none",
              "--number-last", "--scst-reward", "objects+counts", "--scst-object-weight",
              "10", "--scst-count-weight", "10", "--scst-count-over", "scene", "--scst-samples", "5", "--scst-lr",
              "1e-4", "--scst-from", "10", "--epochs", "15", "--time-limit", "1000", "--time-clock", "cpu"]
# the hard recipe as sessions 8-16 shipped it (no location, no number_last, the objects reward over named groups,
# 40 epochs within 27 minutes): the hard rows before session 17 were measured on it
# (each row adds its own --location / --no-location and --number-last / --no-number-last: argparse refuses both)
# (--lookalike 0: the recipe has had look-alike channels since session 19)
# (--dataset shapes --scst-dataset none: since session 20 it has cross-entropy on repeated objects, SCST on the usual
# scenes; --scst-from 11 --time-clock wall: since session 20 it has 11 epochs, SCST from 8, a 29.5 CPU-minute cap)
# (--no-singular-nouns --no-count-head --no-scst-inhibit --scst-split-score 0: the recipe has had singular nouns, the
# count head, inhibited SCST samples and a split score of -1 since session 32)
_HARD_BEFORE32 = ["--no-singular-nouns", "--no-count-head", "--no-scst-inhibit", "--scst-split-score", "0",
                  "--no-merge-repeats",  # since session 33 the recipe merges repeated phrases
                  "--plural-spread", "0"]  # since session 38 it says one-place plurals as one
_HARD16 = ["--config", "shapes-hard", *_HARD_BEFORE32, "--inhibit-named", "0", "--length-penalty", "0",
           "--repeat-penalty", "0", "--scst-reward", "objects", "--scst-count-over", "named", "--epochs", "40",
           "--time-limit", "27", "--lookalike", "0", "--dataset", "shapes", "--scst-dataset", "none", "--scst-from",
           "11", "--time-clock", "wall"]
# the hard recipe as session 17 shipped it (location-aware, number last, cider+objects+counts over the scene)
_HARD17 = [*_HARD16, "--location", "--number-last", "--scst-reward", "cider+objects+counts", "--scst-count-over",
           "scene", *_EPOCHS15]
# the recipes as session 19 shipped them (look-alike channels; soft: cross-entropy on repeated objects, SCST on the
# usual scenes)
_SHIPPED19 = [*_SHIPPED15, "--lookalike", "4", "--dataset", str(_REPEATS), "--scst-dataset", str(_SHAPES)]
_HARD19 = [*_HARD17, "--lookalike", "4"]
# ... and the hard recipe as session 20 shipped it (cross-entropy on repeated objects, SCST on the usual scenes)
_HARD20 = [*_HARD19, "--dataset", str(_REPEATS), "--scst-dataset", str(_SHAPES)]
# ... and both as session 20 shipped them, within issue 21's budget (fewer cross-entropy epochs, a 29.5 CPU-minute cap)
_BUDGET = ["--time-limit", "29.5", "--time-clock", "cpu"]
_SHIPPED20 = [*_SHIPPED19, "--epochs", "14", "--scst-from", "9", *_BUDGET]
_HARD20_SHIPPED = [*_HARD20, "--epochs", "11", "--scst-from", "8", *_BUDGET]
# the recipes as session 26 left them: session 20's training, the decoding settings chosen on val in sessions 25-26
_SOFT26 = [*_SHIPPED20, "--inhibit-named", "10", "--length-penalty", "1.5", "--repeat-penalty", "4"]
_HARD26 = [*_HARD20_SHIPPED, "--inhibit-named", "10", "--length-penalty", "1.5", "--repeat-penalty", "2"]
# session 30's hard row run to 18 epochs (session 31 on), the base of its reruns and variants
_HARD30_18 = [*_HARD26, "--singular-nouns", "--count-head", "--scst-inhibit", "--scst-from", "6", "--epochs", "18",
              "--length-penalty", "1", "--repeat-penalty", "4", "--scst-split-score", "-1"]
# the soft recipe as it was before session 14 shipped it with number_last (the rows measured before then)
_SOFT = [*_SHIPPED14, "--no-number-last"]
COUNTING: dict[str, list[str]] = {
    "soft recipe, CE only (4 epochs)": [*_SOFT, *_CE4],
    "soft recipe + count head, CE only (4 epochs)": [*_SOFT, "--count-head", *_CE4],
    "soft recipe + count head + count mask (lambda 1), CE only (4 epochs)": [
        *_SOFT, "--count-head", "--count-mask", "--lambda-mask", "1", *_CE4],
    "soft recipe + count head + count mask (lambda 10), CE only (4 epochs)": [
        *_SOFT, "--count-head", "--count-mask", "--lambda-mask", "10", *_CE4],
    "soft recipe, SCST cider+objects+counts": [*_SOFT, "--scst-reward", "cider+objects+counts",
                                               *_SCST],
    "soft recipe + count head, SCST cider+objects+counts": [*_SOFT, "--count-head",
                                                            "--scst-reward", "cider+objects+counts", *_SCST],
    "hard recipe + count head, SCST cider+objects+counts": [
        *_HARD16, "--no-location", "--no-number-last", "--count-head", "--scst-reward", "cider+objects+counts", *_SCST],
    "soft recipe + count head, SCST cider+objects+counts, count weight 30": [
        *_SOFT, "--count-head", "--scst-reward", "cider+objects+counts", "--scst-count-weight", "30",
        *_SCST],
    "soft recipe + number last + count head, SCST cider+objects+counts": [
        *_SHIPPED14, "--number-last", "--count-head", "--scst-reward", "cider+objects+counts", *_SCST],
    "soft recipe + number last, SCST cider+objects+counts": [
        *_SHIPPED14, "--number-last", "--scst-reward", "cider+objects+counts", *_SCST],
    "hard recipe + number last + count head, SCST cider+objects+counts": [
        *_HARD16, "--no-location", "--number-last", "--count-head", "--scst-reward", "cider+objects+counts", *_SCST],
    "soft recipe + number last, the recipe's own SCST (objects, from epoch 10)": [
        *_SHIPPED14, "--number-last"],
    "soft recipe + count head + count mask (lambda 10), SCST cider+objects+counts": [
        *_SOFT, "--count-head", "--count-mask", "--lambda-mask", "10",
        "--scst-reward", "cider+objects+counts", *_SCST],
    "soft recipe + count head + count mask (lambda 10), SCST cider+objects+counts, count weight 30": [
        *_SOFT, "--count-head", "--count-mask", "--lambda-mask", "10",
        "--scst-reward", "cider+objects+counts", "--scst-count-weight", "30", *_SCST],
    # session 14: shapes-soft has number_last since this session; these rows change the shipped recipes only
    "soft recipe as shipped (number last), seed 1": [*_SHIPPED14, "--seed", "1"],
    "soft recipe as shipped + count head, SCST cider+objects+counts (the recipe's schedule and selection)": [
        *_SHIPPED14, "--count-head", "--scst-reward", "cider+objects+counts"],
    "soft recipe as shipped, SCST cider+objects+counts (the recipe's schedule and selection)": [
        *_SHIPPED14, "--scst-reward", "cider+objects+counts"],
    "soft recipe as shipped, SCST objects+counts (the recipe's schedule and selection)": [
        *_SHIPPED14, "--scst-reward", "objects+counts"],
    "hard recipe + number last, the recipe's own SCST (objects, from epoch 11)": [
        *_HARD16, "--no-location", "--number-last", "--time-clock", "cpu", "--time-limit", "27"],
    # session 15: a budget in epochs, not minutes (the shipped soft run's 15: 9 cross-entropy + 6 SCST), so that a
    # slower host or cores shared between rows no longer cut the self-critical phase short
    "soft recipe as shipped, SCST cider+objects+counts, 15 epochs": [
        *_SHIPPED14, "--scst-reward", "cider+objects+counts", *_EPOCHS15],
    "soft recipe as shipped, SCST cider+objects+counts, 15 epochs, train repeat probability 0.5": [
        *_SHIPPED14, "--scst-reward", "cider+objects+counts", "--dataset", str(_REPEATS), *_EPOCHS15],
    "hard recipe + number last, SCST cider+objects+counts (from epoch 11), 15 epochs": [
        *_HARD16, "--no-location", "--number-last", "--scst-reward", "cider+objects+counts", *_EPOCHS15],
    # the count term over all of the scene's groups: a group left out scores as a wrong number
    "soft recipe as shipped, SCST cider+objects+counts over the scene's groups, 15 epochs": [
        *_SHIPPED14, "--scst-reward", "cider+objects+counts", "--scst-count-over", "scene", *_EPOCHS15],
    "soft recipe as shipped, SCST objects+counts over the scene's groups, 15 epochs": [
        *_SHIPPED14, "--scst-reward", "objects+counts", "--scst-count-over", "scene", *_EPOCHS15],
    "soft recipe as shipped, SCST objects+counts over the scene's groups, 15 epochs, train repeat probability 0.35": [
        *_SHIPPED14, "--scst-reward", "objects+counts", "--scst-count-over", "scene", "--dataset", str(_REPEATS35),
        *_EPOCHS15],
    "hard recipe + number last, SCST cider+objects+counts over the scene's groups (from epoch 11), 15 epochs": [
        *_HARD16, "--no-location", "--number-last", "--scst-reward", "cider+objects+counts", "--scst-count-over",
        "scene", *_EPOCHS15],
    # session 16: the same 15 epochs with the self-critical phase started earlier (its epochs are the shorter ones)
    "soft recipe as shipped in session 15, SCST from epoch 6, 15 epochs": [*_SHIPPED15, "--scst-from", "6"],
    "soft recipe as shipped in session 15, SCST from epoch 4, 15 epochs": [*_SHIPPED15, "--scst-from", "4"],
    "soft recipe as shipped in session 15, SCST from epoch 6, count weight 20, 15 epochs": [
        *_SHIPPED15, "--scst-from", "6", "--scst-count-weight", "20"],
    "soft recipe as shipped in session 15, SCST learning rate 5e-5, 15 epochs": [*_SHIPPED15, "--scst-lr", "5e-5"],
    "soft recipe as shipped in session 15, 10 SCST samples per image, 15 epochs": [*_SHIPPED15, "--scst-samples", "10"],
    # session 17: the other end of session 16's schedule rows (earlier SCST named more pairs in two phrases)
    "soft recipe as shipped in session 15, SCST from epoch 12, 15 epochs": [*_SHIPPED15, "--scst-from", "12"],
    # session 17: hard attention told where it looked before (the previous alpha and the coverage), as soft is
    "hard recipe + number last + location-aware attention, SCST cider+objects+counts over the scene's groups (from "
    "epoch 11), 15 epochs": _HARD17,
    # on the hard recipe shipped in session 17 (the row above)
    "hard recipe as shipped in session 17, SCST objects+counts (no CIDEr-D term, as the soft recipe)": [
        *_HARD17, "--scst-reward", "objects+counts"],
    "hard recipe as shipped in session 17, SCST from epoch 8": [*_HARD17, "--scst-from", "8"],
    # session 18: cross-entropy on scenes with more repeated objects (pairs were learnt best there, but the prior
    # moved: "two" for single objects), the self-critical phase on the usual scenes, whose reward sets the prior back
    "soft recipe as shipped in session 15, cross-entropy on train repeat probability 0.5, SCST on the usual scenes": [
        *_SHIPPED15, "--dataset", str(_REPEATS), "--scst-dataset", str(_SHAPES)],
    "hard recipe as shipped in session 17, cross-entropy on train repeat probability 0.5, SCST on the usual scenes": [
        *_HARD17, "--dataset", str(_REPEATS), "--scst-dataset", str(_SHAPES)],
    # ... and the other way round: does the self-critical phase's data set the pair rate?
    "soft recipe as shipped in session 15, SCST on train repeat probability 0.5 (cross-entropy on the usual scenes)": [
        *_SHIPPED15, "--scst-dataset", str(_REPEATS)],
    # the self-critical phase names more pairs in two phrases the longer it runs (sessions 16-18): the objects term
    # scores them as right, the count term as any wrong number. Here such a group costs as much as a right one earns.
    "soft recipe as shipped in session 15, a group named in several phrases scores -1 in the count term": [
        *_SHIPPED15, "--scst-split-score", "-1"],
    "hard recipe as shipped in session 17, a group named in several phrases scores -1 in the count term": [
        *_HARD17, "--scst-split-score", "-1"],
    # session 19: sessions 14-18 moved pair errors between kinds without the model seeing the second copy. Four
    # look-alike channels (captioner/lookalike.py) tell every location whether something far from it looks like it.
    "soft recipe as shipped in session 15 + 4 look-alike channels": [*_SHIPPED15, "--lookalike", "4"],
    "hard recipe as shipped in session 17 + 4 look-alike channels": [*_HARD17, "--lookalike", "4"],
    # the channels tell a twin from a single object (bench/lookalike_probe.py), but after cross-entropy on the usual
    # scenes the model rarely says a plural for a pair, so SCST seldom samples one to reward. Cross-entropy on the
    # repeated objects taught plurals (session 18) that SCST then un-taught without a way to see the twin.
    "soft recipe as shipped in session 15 + 4 look-alike channels, cross-entropy on train repeat probability 0.5, "
    "SCST on the usual scenes": [*_SHIPPED15, "--lookalike", "4", "--dataset", str(_REPEATS), "--scst-dataset",
                                 str(_SHAPES)],
    # session 20: the look-alike channels cost one (L, L) product per row of the initial state, so batches of whole
    # images (--group-by-image: about 13 images for 64 captions) run them once per image. Does the budget come back
    # without losing what the channels bought? And the combination that won for soft, on the hard recipe.
    "soft recipe as shipped in session 19, batches of whole images": [*_SHIPPED19, "--group-by-image"],
    "hard recipe as shipped in session 19, cross-entropy on train repeat probability 0.5, SCST on the usual scenes, "
    "batches of whole images": [*_HARD19, "--dataset", str(_REPEATS), "--scst-dataset", str(_SHAPES),
                                "--group-by-image"],
    # (that row was stopped after 6 of 15 epochs: validation object F1 0.861 against 0.922 for the shipped recipe
    # at epoch 6; the same without whole-image batches, and with the channels' blocked form, captioner/lookalike.py)
    "hard recipe as shipped in session 19, cross-entropy on train repeat probability 0.5, SCST on the usual scenes": [
        *_HARD19, "--dataset", str(_REPEATS), "--scst-dataset", str(_SHAPES)],
    # pairs are still the soft model's main count error (split into two phrases): more of them in cross-entropy
    "soft recipe as shipped in session 19, cross-entropy on train repeat probability 0.7": [
        *_SHIPPED19, "--dataset", str(_REPEATS70)],
    # how far seeds of the shipped soft recipe spread (its test F1 is 0.003 from issue 21's 0.97; started, then
    # stopped for the budget rows below: not measured)
    "soft recipe as shipped in session 19, seed 1": [*_SHIPPED19, "--seed", "1"],
    # issue 21's budget (27-30 minutes): the shipped recipes with fewer cross-entropy epochs, so that they end within
    # 29.5 CPU minutes (the cap stops a run that would not)
    "soft recipe as shipped in session 19, 14 epochs, SCST from epoch 9, 29.5 minutes": _SHIPPED20,
    "hard recipe as shipped in session 20, 11 epochs, SCST from epoch 8, 29.5 minutes": _HARD20_SHIPPED,
    # session 21: a group named in several phrases is now the largest count error of both shipped models (soft
    # test_novel: 64 of 125 wrong groups; hard: 84 of 162), and a single object named twice is part of it. Session
    # 18 penalised it (split score -1) before the model could see a twin: pairs became "a" and singles went missing.
    # With the look-alike channels the twin is visible, so the penalty may now teach "two" instead.
    # Measured in session 22 (bench/results/ablation_s21_counting.json; a slower host: the 29.5 CPU minutes ended
    # soft at epoch 10 and hard at 11, against 13 and 11 in session 20). Soft lost: test / test_novel F1 0.961 / 0.944,
    # count 0.942 / 0.919 (shipped 0.967 / 0.951, 0.947 / 0.933). Hard traded F1 for counts: F1 0.941 / 0.919, count
    # 0.951 / 0.934 (shipped 0.951 / 0.927, 0.936 / 0.911). Neither shipped.
    "soft recipe as shipped in session 20, SCST split score -1": [*_SHIPPED20, "--scst-split-score", "-1"],
    "hard recipe as shipped in session 20, SCST split score -1": [*_HARD20_SHIPPED, "--scst-split-score", "-1"],
    # session 22: -1 bought hard counts (+0.015 / +0.023) for F1 (-0.010 / -0.008); a weaker penalty. Measured in
    # session 22: test F1 0.956, count 0.945; test_novel F1 0.920, count 0.902 (novel counts below shipped): not shipped
    "hard recipe as shipped in session 20, SCST split score -0.5": [*_HARD20_SHIPPED, "--scst-split-score", "-0.5"],
    # session 23: every row above is one seed, and the split-score rows moved test_novel counts by -0.009 to +0.023
    # without a monotone trend. How far does another seed of each shipped recipe land from its shipped run? Soft is
    # capped at the 12 epochs its shipped run completed within the 29.5 CPU minutes (hard completed its 11), so that
    # on a faster host only the seed differs.
    "soft recipe as shipped in session 20, seed 1, 12 epochs": [*_SHIPPED20, "--epochs", "12", "--seed", "1"],
    "hard recipe as shipped in session 20, seed 1": [*_HARD20_SHIPPED, "--seed", "1"],
    # measured in session 23 on a host slower per thread than session 20's: soft test / test_novel F1 0.966 / 0.950,
    # count 0.942 / 0.927 after 11 of its 12 epochs (the shipped run: 0.967 / 0.951, 0.947 / 0.933); hard 0.936 /
    # 0.898, count 0.919 / 0.896, but the cap ended it after 9 of 11 epochs (2 SCST epochs, not 4). So the epochs
    # without the cap, and a third soft seed:
    "hard recipe as shipped in session 20, seed 1, its 11 epochs without the time cap": [
        *_HARD20_SHIPPED, "--seed", "1", "--time-limit", "1000"],
    "soft recipe as shipped in session 20, seed 2, 12 epochs without the time cap": [
        *_SHIPPED20, "--epochs", "12", "--seed", "2", "--time-limit", "1000"],
    # measured in session 23 (36.1 and 32.6 CPU minutes): hard seed 1 with its 11 epochs 0.949 / 0.920, count 0.936 /
    # 0.910 (shipped 0.951 / 0.927, 0.936 / 0.911); soft seed 2 0.959 / 0.949, count 0.923 / 0.928. Seeds move test
    # count accuracy by up to 0.024: no seed reaches issue 21's 0.95 (README "Counting", session 23)
    # session 24: the noun in the singular, so that the number word that ends the phrase alone says how many, one
    # step (and one glimpse) after the noun, with one "two" shared by every shape and colour (captioner.phrase_order).
    # The epochs of the uncapped seed rows above, so that only the captions' form differs.
    "soft recipe as shipped in session 20, singular nouns, 12 epochs without the time cap": [
        *_SHIPPED20, "--singular-nouns", "--epochs", "12", "--time-limit", "1000"],
    "hard recipe as shipped in session 20, singular nouns, its 11 epochs without the time cap": [
        *_HARD20_SHIPPED, "--singular-nouns", "--time-limit", "1000"],
    # session 24: pairs whose copies lie within 3 cells of each other were counted right in 17% of test scenes by
    # every model of session 23 (73-86% at 3-8 cells): the look-alike channels leave out the 7x7 cells around each
    # location, so such a twin is invisible to them. Two more channels that leave out only the 3x3 cells around it:
    "soft recipe as shipped in session 20, 2 near look-alike channels, 12 epochs without the time cap": [
        *_SHIPPED20, "--lookalike-near", "2", "--epochs", "12", "--time-limit", "1000"],
    "hard recipe as shipped in session 20, 2 near look-alike channels, its 11 epochs without the time cap": [
        *_HARD20_SHIPPED, "--lookalike-near", "2", "--time-limit", "1000"],
    # session 24: with singular nouns the number word is said one step after the noun, and teacher-forced its
    # attention spreads over both copies of a pair (2.2 cells for one large object, 4.1 for two; entropy 3.3 against
    # 4.2 nats: bench/count_diagnosis.py), a second glimpse. The count head (session 12: tanh(W [z; alpha's entropy;
    # -log max alpha]) added to the deep output) hands that spread to the word; it had not been tried since the
    # look-alike channels came (session 19), nor with the number word after a singular noun
    "soft recipe as shipped in session 20, singular nouns, count head, 12 epochs without the time cap": [
        *_SHIPPED20, "--singular-nouns", "--count-head", "--epochs", "12", "--time-limit", "1000"],
    # measured in session 24 (test / test_novel): singular nouns F1 0.965 / 0.950, count 0.946 / 0.938; with the
    # count head 0.967 / 0.945, 0.948 / 0.928; the near channels 0.954 / 0.932, 0.939 / 0.927 (no better at close
    # pairs). Within the seeds' spread of session 23, so a second seed of the first two:
    "soft recipe as shipped in session 20, singular nouns, seed 1, 12 epochs without the time cap": [
        *_SHIPPED20, "--singular-nouns", "--seed", "1", "--epochs", "12", "--time-limit", "1000"],
    "soft recipe as shipped in session 20, singular nouns, count head, seed 1, 12 epochs without the time cap": [
        *_SHIPPED20, "--singular-nouns", "--count-head", "--seed", "1", "--epochs", "12", "--time-limit", "1000"],
    # measured in session 24: singular nouns seed 1 0.965 / 0.941, count 0.941 / 0.918 (the test_novel gain did not
    # hold); with the count head seed 1 0.962 / 0.946, count 0.949 / 0.927, test pairs 0.830. Nothing reached 0.95
    # session 25: inhibition of return (--inhibit-named, captioner.decoder.Named) is a decoding setting: the shipped
    # checkpoints decoded with it (weights chosen on val by scripts/tune_decoding.py; bench/decoding_settings.py for
    # the other runs) name fewer objects twice. Here the self-critical samples are drawn with it too, so that the
    # reward scores the captions the model will write (validation and test decode with it as well)
    "soft recipe as shipped in session 20, inhibition 5, SCST samples inhibited, 12 epochs without the time cap": [
        *_SHIPPED20, "--inhibit-named", "5", "--scst-inhibit", "--epochs", "12", "--time-limit", "1000"],
    "hard recipe as shipped in session 20, inhibition 10, SCST samples inhibited, its 11 epochs without the time cap": [
        *_HARD20_SHIPPED, "--inhibit-named", "10", "--scst-inhibit", "--time-limit", "1000"],
    # measured in session 25 (43.2 and 48.1 CPU minutes beside other work): soft 0.969 / 0.949, count 0.947 / 0.923
    # (no gain over the shipped checkpoint with inhibition, 0.966 / 0.955, 0.951 / 0.938); hard 0.968 / 0.942, count
    # 0.954 / 0.936 (shipped with inhibition 0.957 / 0.939, 0.944 / 0.929). One seed; the hard row's second:
    "hard recipe as shipped in session 20, inhibition 10, SCST samples inhibited, seed 1, its 11 epochs without the "
    "time cap": [*_HARD20_SHIPPED, "--inhibit-named", "10", "--scst-inhibit", "--seed", "1", "--time-limit", "1000"],
    # measured in session 26: seed 1 0.959 / 0.930, count 0.932 / 0.913 (54 CPU minutes, resumed once): below seed 0
    # and below the shipped hard checkpoint with inhibition, so seed 0's gain was the seed's, not the idea's
    # session 27: look-alike supervision (--lambda-twin, captioner.losses.twin_loss). The shipped hard model's count
    # errors on test_novel were mostly singles said "two" (41) whose scene held another object of the same colour or
    # shape ("two little cyan stars" for a cyan star and a cyan cross): the channels, learnt from the captions alone,
    # called a partial look-alike a twin. Here their pair scores learn from the boxes which cells are identical copies.
    # The recipes as session 26 left them (its decoding settings), within the budget:
    "soft recipe as shipped in session 26, look-alike supervision (lambda 1)": [*_SOFT26, "--lambda-twin", "1"],
    "hard recipe as shipped in session 26, look-alike supervision (lambda 1)": [*_HARD26, "--lambda-twin", "1"],
    # measured in session 27 (27.7 and 29.5 CPU minutes, two at a time): soft 0.964 / 0.950, count 0.932 / 0.915; hard
    # 0.955 / 0.911, count 0.897 / 0.881, both below the shipped checkpoints (soft 0.970 / 0.957, 0.959 / 0.944; hard
    # 0.961 / 0.947, 0.946 / 0.933). The pair-score loss stayed near 0.29 from epoch 5 on.
    # Session 27, second round, within the budget on a host where the soft recipe's 14 epochs take 28 CPU minutes:
    # session 24's soft row that reached every soft bar with session 26's decoding settings but took 34 minutes there,
    # and the hard recipe with inhibited SCST samples (session 25's best hard row, 48 minutes uncapped) whose
    # self-critical phase starts at epoch 6, so that the cap leaves it eight or nine epochs instead of four.
    "soft recipe as shipped in session 26, singular nouns, count head": [*_SOFT26, "--singular-nouns", "--count-head"],
    "hard recipe as shipped in session 26, SCST samples inhibited, SCST from epoch 6, 14 epochs": [
        *_HARD26, "--scst-inhibit", "--scst-from", "6", "--epochs", "14"],
    # measured in session 28 (27.0 and 29.6 CPU minutes, two at a time): soft 0.975 / 0.944, count 0.968 / 0.953 but
    # CIDEr-D 3.19 / 2.96: decoded with a length penalty of 1.5 this run drops the "and" between phrases ("a large
    # pink disc a little orange triangle": 130 of the 613 test captions of two or more phrases, the hard row 36 of
    # 617), which session 24's singular-nouns runs did not (CIDEr-D 4.63 with the same settings); decoded without it (chosen on val, scripts/tune_decoding.py) 0.970 / 0.938,
    # count 0.966 / 0.951, CIDEr-D 4.61 / 4.20: every soft bar but test_novel F1. Hard 0.974 / 0.950, count 0.940 /
    # 0.927, CIDEr-D 4.45 / 4.17: its pairs still come out as two phrases ("a small cyan box and a small cyan box", 48
    # of 2+ groups on test). Session 28: both changes together, in both recipes, decoded without a length penalty:
    "soft recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST from epoch 6, "
    "no length penalty": [*_SOFT26, "--singular-nouns", "--count-head", "--scst-inhibit", "--scst-from", "6",
                          "--length-penalty", "0"],
    "hard recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST from epoch 6, "
    "14 epochs, no length penalty": [*_HARD26, "--singular-nouns", "--count-head", "--scst-inhibit", "--scst-from",
                                     "6", "--epochs", "14", "--length-penalty", "0"],
    # measured in session 29 (24.6 and 29.5 CPU minutes, two at a time; hard stopped after 13 epochs at the cap),
    # decoded with the settings chosen on val (10 / 1 / 4 for both): soft 0.979 / 0.953, count 0.964 / 0.947, CIDEr-D
    # 4.63 / 4.20, 7.3x: every soft bar but test_novel count (0.003 short); hard 0.961 / 0.931, count 0.942 / 0.931,
    # CIDEr-D 4.44 / 4.14, 9.2x: counts no better than the shipped hard checkpoint. Session 30's round: the soft row
    # with the five minutes its 14 epochs left (val counts still rose at epoch 14), and the hard row with the split
    # score that bought hard counts for some F1 in session 22 (F1 here is 0.011 above its bars), both decoded
    # with the settings chosen for them here:
    "soft recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST from epoch 6, "
    "17 epochs, length penalty 1": [*_SOFT26, "--singular-nouns", "--count-head", "--scst-inhibit", "--scst-from",
                                    "6", "--length-penalty", "1", "--epochs", "17"],
    "hard recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST from epoch 6, "
    "14 epochs, SCST split score -1, length penalty 1, repeat penalty 4": [
        *_HARD26, "--singular-nouns", "--count-head", "--scst-inhibit", "--scst-from", "6", "--epochs", "14",
        "--length-penalty", "1", "--repeat-penalty", "4", "--scst-split-score", "-1"],
    # measured in session 30 (26.1 and 28.9 CPU minutes): soft 0.979 / 0.951, count 0.962 / 0.950 (0.9505), CIDEr-D
    # 4.62 / 4.22, 7.3x: every soft bar, thin margins, one seed, not yet shipped; hard 0.965 / 0.932, count 0.949 /
    # 0.937, CIDEr-D 4.46 / 4.20, 9.3x: above the shipped hard checkpoint on every figure, count still short
    # Session 31: the soft row again with a second seed before it is shipped (seeds move these figures by about 0.01,
    # session 23), and the hard row with the soft recipe's reward, objects + counts without the CIDEr-D term: its
    # CIDEr-D (4.46) is 0.56 above its bar, so the count term can take the CIDEr-D term's share (session 17 tried it
    # before the look-alike channels and singular nouns, and lost CIDEr-D: 3.66)
    "soft recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST from epoch 6, "
    "17 epochs, length penalty 1, seed 1": [*_SOFT26, "--singular-nouns", "--count-head", "--scst-inhibit",
                                            "--scst-from", "6", "--length-penalty", "1", "--epochs", "17",
                                            "--seed", "1"],
    "hard recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST from epoch 6, "
    "14 epochs, SCST split score -1, length penalty 1, repeat penalty 4, SCST objects+counts": [
        *_HARD26, "--singular-nouns", "--count-head", "--scst-inhibit", "--scst-from", "6", "--epochs", "14",
        "--length-penalty", "1", "--repeat-penalty", "4", "--scst-split-score", "-1",
        "--scst-reward", "objects+counts"],
    # measured in session 31 (25.1 and 29.0 CPU minutes): soft seed 1 0.976 / 0.965, count 0.957 / 0.941 (test_novel
    # count short: seed 0's 0.9505 is not the recipe's for every seed); hard without the CIDEr-D term 0.963 / 0.921,
    # count 0.952 / 0.932, CIDEr-D 4.48 / 4.13: below session 30's hard row on test_novel (negative). Then hard
    # training got faster (session 31: expected-context cross-entropy batches through the fast teacher-forced pass,
    # 1.47x; self-critical sampling steps only the running samples, 1.27x; bench/hard_training_paths.py), so the
    # cap holds more self-critical epochs: session 30's hard row run to 18 epochs, seeds 0 and 1.
    "hard recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST from epoch 6, "
    "18 epochs, SCST split score -1, length penalty 1, repeat penalty 4": _HARD30_18,
    "hard recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST from epoch 6, "
    "18 epochs, SCST split score -1, length penalty 1, repeat penalty 4, seed 1": [*_HARD30_18, "--seed", "1"],
    # measured in session 31 (29.6 and 29.5 CPU minutes): seed 0 0.965 / 0.943, count 0.960 / 0.950 (0.9503), CIDEr-D
    # 4.51 / 4.32, 9.2x: every hard bar; seed 1 0.966 / 0.938, count 0.959 / 0.941. Session 32: seed 0 again in a new
    # checkout (its run was lost with the old one) to be shipped, and the shipped soft recipe (session 30's row, test
    # count 0.962, test_novel 0.950 by one group) with the epochs the cap still holds: its val counts rose to the end
    "soft recipe as shipped in session 31, 19 epochs": ["--config", "shapes-soft", "--epochs", "19",
                                                        "--no-merge-repeats", *_SOFT_BEFORE39],
    # measured in session 32: the hard rerun stopped after 17 epochs (patience 5 after its best val epoch 12) in 22.2
    # CPU minutes, 0.972 / 0.940, count 0.963 / 0.9495, CIDEr-D 4.56 / 4.23, 9.27x; val chose 10 / 1.5 / 4, test_novel
    # count 0.949: the same seed in a new checkout misses the bar session 31's run met, so it is not shipped. Soft
    # with 19 epochs 0.972 / 0.956, count 0.948 / 0.941, CIDEr-D 4.30 / 4.02 in 24.6 minutes: below the shipped
    # soft checkpoint (negative).
    # Session 36: the hard 18-epoch seed-0 row in a fifth checkout stopped after 13 epochs (patience 5 after its best
    # val object F1, epoch 8) in 19.4 CPU minutes: 0.963 / 0.921, count 0.937 / 0.912 (session 33's fourth rerun to the
    # digit), while its val count accuracy still rose (0.935 at epoch 8, 0.943 at 12). So the same row chosen on val
    # count accuracy, with a patience that lets it use the whole budget (18 epochs or 29.5 CPU minutes).
    "hard recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST from epoch 6, "
    "18 epochs, SCST split score -1, length penalty 1, repeat penalty 4, chosen on val count accuracy, patience 20": [
        *_HARD30_18, "--metric", "count_accuracy", "--patience", "20"],
    # measured in session 36 (25.6 CPU minutes, all 18 epochs, best val count at epoch 9): 0.947 / 0.905, count 0.942 /
    # 0.921, CIDEr-D 4.41 / 4.10, 8.96x; weaker from its first epoch than the row above with the same seed (val count
    # 0.683 against 0.731): negative.
    # Session 39: the soft recipe as sessions 31-38 shipped it (SCST reward objects+counts, 10 x each) ended a list of
    # phrases without "and" in a quarter of its captions (244 of 1000 on val; 0 of 300 after its cross-entropy
    # epochs; bench/list_closure.py), which no reference does. The same recipe with CIDEr-D in the SCST reward, at
    # three weights of the other two terms, and once run to the budget (patience 20). Chosen on val (beam 3): the row
    # whose val F1 + count is at most 0.005 below the shipped checkpoint's, with the fewest unclosed lists.
    "soft recipe as shipped in session 31, SCST cider+objects+counts": [
        "--config", "shapes-soft", "--scst-reward", "cider+objects+counts", "--scst-object-weight", "10",
        "--scst-count-weight", "10"],
    "soft recipe as shipped in session 31, SCST cider+objects+counts, patience 20": [
        "--config", "shapes-soft", "--scst-reward", "cider+objects+counts", "--scst-object-weight", "10",
        "--scst-count-weight", "10", "--patience", "20"],
    "soft recipe as shipped in session 31, SCST cider+objects+counts, 15 x objects and counts": [
        "--config", "shapes-soft", "--scst-reward", "cider+objects+counts", "--scst-object-weight", "15",
        "--scst-count-weight", "15"],
    # the shipped recipe since session 39 (recipes/shapes-soft.toml)
    "soft recipe as shipped in session 31, SCST cider+objects+counts, 20 x objects and counts": [
        "--config", "shapes-soft", "--scst-reward", "cider+objects+counts", "--scst-object-weight", "20",
        "--scst-count-weight", "20"],
    # measured in session 39 (val unclosed lists of 1000 / val F1 + count / test F1 / test_novel F1 / test_novel
    # count / CPU min): 10 x: 8 / 1.942 / 0.974 / 0.943 / 0.944 / 22.7; patience 20: 55 / 1.945 / 0.971 / 0.947 /
    # 0.956 / 29.6; 15 x: 65 / 1.931 / 0.969 / 0.945 / 0.951 / 21.9; 20 x: 143 / 1.951 / 0.976 / 0.954 / 0.962 /
    # 28.5 (shipped); the recipe before: 244 / 1.955 / 0.980 / 0.954 / 0.964 / 26.1.
}
GROUPS = {"attention": VARIANTS, "counting": COUNTING}


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").replace("--", "-")


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--group", choices=tuple(GROUPS), default="attention",
                   help="attention: the attention choices on the base recipe; counting: the counting ideas on the "
                        "shipped recipes (default: %(default)s)")
    p.add_argument("--variants", default=None, help="comma-separated variant slugs or names (default: all)")
    p.add_argument("--minutes", type=float, default=4.0, help="training time budget per variant (default: %(default)s)")
    p.add_argument("--parallel", type=int, default=2,
                   help="variants trained at once, one torch thread each (default: %(default)s)")
    p.add_argument("--max-val-images", type=int, default=300, help="val images decoded per epoch (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=30, help="epoch cap per variant (default: %(default)s)")
    p.add_argument("--runs", default="runs/ablation", help="where the runs go (default: %(default)s)")
    p.add_argument("--out", default="bench/results/ablation.json", help="JSON output (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="retrain variants that already have results")
    p.add_argument("--extra", default="", help="extra train.py flags for every variant, as one string")
    return p


def variant_command(name: str, flags: list[str], args) -> tuple[list[str], Path]:
    out = ROOT / args.runs / slug(name)
    if getattr(args, "group", "attention") == "counting":  # complete recipes: only the run's own settings are added
        cmd = [sys.executable, str(ROOT / "train.py"), *flags, "--out", str(out), "--no-progress", "--threads", "1",
               *args.extra.split()]
        return cmd, out
    # the dataset's folder, not its name: variants start from TrainConfig's defaults, not the shapes-soft recipe
    cmd = [sys.executable, str(ROOT / "train.py"), "--dataset", str(ROOT / "datasets" / "shapes"), "--out", str(out),
           "--no-progress",
           "--time-limit", str(args.minutes), "--epochs", str(args.epochs), "--threads", "1",
           "--max-val-images", str(args.max_val_images), *RECIPE, *flags, *args.extra.split()]
    return cmd, out


def results_of(out: Path) -> dict[str, Path]:
    return {s: out / f"results_{s}.json" for s in ("test", "test_novel")}


def run_variants(wanted: dict[str, list[str]], args) -> list[dict]:
    """Train the variants that lack results, ``args.parallel`` at a time; then read every variant's results."""
    todo = []
    for name, flags in wanted.items():
        cmd, out = variant_command(name, flags, args)
        if args.force or not all(p.is_file() for p in results_of(out).values()):
            todo.append((name, cmd, out))
    running: list[tuple[str, subprocess.Popen]] = []
    while todo or running:
        while todo and len(running) < args.parallel:
            name, cmd, out = todo.pop(0)
            out.mkdir(parents=True, exist_ok=True)
            print(f"[ablation] {name}: {' '.join(cmd[1:])}", flush=True)
            log = open(out.parent / f"{out.name}.log", "w")
            running.append((name, subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)))
        name, proc = running.pop(0)
        if proc.wait() != 0:
            raise SystemExit(f"error: variant {name!r} failed (exit {proc.returncode}); see its log in {args.runs}")
    rows = []
    for name, flags in wanted.items():
        _, out = variant_command(name, flags, args)
        row = {"variant": name, "flags": " ".join(flags)}
        for split, path in results_of(out).items():
            row[split] = json.loads(path.read_text())["metrics"]
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    head = ("| variant | split | BLEU-4 | CIDEr-D | object F1 | scene acc. | count acc. (groups of 2+) | "
            "attention correctness | uniform | ratio | attention entropy | train min |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        for split in ("test", "test_novel"):
            m = r[split]
            counts = (f"{m['scene_accuracy']:.3f} | {m['count_accuracy']:.3f} ({m['count_accuracy_multi']:.3f}) | "
                      if "scene_accuracy" in m else "- | - | ")  # results written before these metrics existed
            lines.append(f"| {r['variant']} | {split} | {m['BLEU-4']:.3f} | {m['CIDEr-D']:.3f} | {m['object_f1']:.3f} | "
                         f"{counts}"
                         f"{m['attention_correctness']:.3f} | {m['attention_uniform']:.3f} | "
                         f"{m['attention_ratio']:.2f}x | {m['attention_entropy']:.2f} | {m['train_minutes']:.1f} |")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    wanted = GROUPS[args.group]
    if args.variants:
        keys = [v.strip() for v in args.variants.split(",")]
        exact = {k for k in keys if any(k in (n, slug(n)) for n in GROUPS[args.group])}

        def matches(name: str, key: str) -> bool:  # a whole slug names one variant; a shorter key, all it begins
            return key in (name, slug(name)) or (key not in exact and slug(name).startswith(key))

        unknown = [k for k in keys if not any(matches(n, k) for n in GROUPS[args.group])]
        if unknown:  # one wrong name among several used to be dropped silently
            print(f"error: no variant matches {unknown[0]!r}; known: {', '.join(slug(n) for n in GROUPS[args.group])}",
                  file=sys.stderr)
            return 2
        wanted = {n: f for n, f in GROUPS[args.group].items() if any(matches(n, k) for k in keys)}
    rows = run_variants(wanted, args)
    out = ROOT / (args.out if args.group == "attention" else args.out.replace(".json", f"_{args.group}.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
