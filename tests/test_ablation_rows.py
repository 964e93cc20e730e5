"""experiments/counting_ablation.py's rows keep the settings they were measured with, whatever the recipe files say
now."""

from dataclasses import asdict
from pathlib import Path

import pytest

from captioner.scenes.plugin import SceneDecoding, SceneModel, SceneTraining
from captioner.commands.train import get_args_parser
from captioner.training.flags import from_args
from experiments import counting_ablation


def flat(cfg) -> dict:
    """A TrainConfig as a nested dict with the model section in the flat form the rows were written in: the
    plug-in's settings and the decoding settings beside the architecture, its training settings in [optim] and
    [scst] (the form of captioner.checkpoints.version1's version-1 checkpoints)."""
    d = cfg.to_dict()
    model, decoding, train = d["model"], d.pop("decoding"), d.pop("plugin")
    plugin_config, plugin_settings = model.pop("plugin_config"), decoding.pop("plugin_settings")
    model.pop("plugin")
    model.update({**asdict(SceneModel()), **asdict(SceneDecoding()), **plugin_config, **plugin_settings,
                  "length_penalty": decoding["length_penalty"]})
    train = {**asdict(SceneTraining()), **train}
    d["optim"].update(lambda_mask=train["lambda_mask"], lambda_twin=train["lambda_twin"])
    d["scst"].update(object_weight=train["object_weight"], count_weight=train["count_weight"],
                     count_over=train["count_over"], split_score=train["split_score"], inhibit=train["scst_inhibit"])
    return d


def resolved(name: str):
    return from_args(get_args_parser().parse_args([*counting_ablation.COUNTING[name], "--out", "x"]))


@pytest.mark.parametrize("name, reward, over, epochs, minutes, number_last", [
    ("soft objects-reward recipe (number first) + count head, CE only (4 epochs)", "objects", "named", 4, 1000.0, False),
    ("soft objects-reward recipe (number last), the recipe's own SCST (objects, from epoch 10)", "objects", "named", 40, 27.0, True),
    ("soft objects-reward recipe (number last), seed 1", "objects", "named", 40, 27.0, True),
    ("soft objects-reward recipe, SCST objects+counts (the recipe's schedule and selection)", "objects+counts", "named",
     40, 27.0, True),
    ("soft objects-reward recipe, SCST cider+objects+counts, 15 epochs", "cider+objects+counts", "named", 15, 1000.0, True),
    ("soft objects-reward recipe, SCST objects+counts over the scene's groups, 15 epochs", "objects+counts", "scene", 15,
     1000.0, True),
    ("soft objects+counts recipe, SCST from epoch 6, 15 epochs", "objects+counts", "scene", 15, 1000.0, True),
    ("soft objects+counts recipe, SCST from epoch 4, 15 epochs", "objects+counts", "scene", 15, 1000.0, True),
])
def test_counting_rows_pin_their_settings(name, reward, over, epochs, minutes, number_last):
    cfg = resolved(name)
    assert (cfg.scst.reward, flat(cfg)["scst"]["count_over"], cfg.optim.epochs, cfg.optim.time_limit, flat(cfg)["model"]["number_last"]) == \
        (reward, over, epochs, minutes, number_last)
    assert cfg.optim.time_clock == "cpu"


DECODING = ("inhibit_named", "length_penalty", "repeat_penalty")  # the recipes' decoding settings
# the flags that make today's shapes-soft the recipe file the soft budget rows were run on: its later counting aids
# off, its former schedule, repeat penalty and reward (the rows' own decoding settings are compared apart)
SOFT_BUDGET_FILE = ["--no-singular-nouns", "--no-count-head", "--no-scst-inhibit", "--no-merge-repeats", "--epochs", "14",
                  "--scst-from", "9",
                  "--repeat-penalty", "4",
                  "--scst-reward", "objects+counts", "--scst-object-weight", "10", "--scst-count-weight", "10"]
# the same for shapes-hard and the hard budget rows
HARD_BUDGET_FILE = ["--no-singular-nouns", "--no-count-head", "--no-scst-inhibit", "--no-merge-repeats", "--scst-split-score",
                  "0", "--plural-spread", "0", "--epochs", "11", "--scst-from", "8", "--length-penalty", "1.5", "--repeat-penalty", "2"]
BUDGET_FILE = {"shapes-soft": SOFT_BUDGET_FILE, "shapes-hard": HARD_BUDGET_FILE}


def assert_row_is_recipe(name: str, recipe_name: str) -> dict:
    """The row resolves to what `train.py --config recipe_name` trains (its data folders named by absolute path),
    but for the decoding settings the recipe has had since (inhibition of return, length and repeat penalties), chosen
    on val after the row was run and never used by it; returns the recipe's settings."""
    budget_file = BUDGET_FILE[recipe_name]
    recipe = flat(from_args(get_args_parser().parse_args(["--config", recipe_name, *budget_file, "--out", "x"])))
    row = flat(resolved(name))
    for field in DECODING:
        assert row["model"][field] == 0.0 < recipe["model"][field], field
        row["model"][field] = recipe["model"][field]
    for section, field in (("data", "dataset"), ("scst", "dataset")):
        assert Path(row[section][field]).name == Path(recipe[section][field]).name
        row[section][field] = recipe[section][field]
    assert row == recipe
    return recipe


def test_the_soft_budget_row_is_the_recipe():
    """The soft budget recipe's row resolves to what `train.py --config shapes-soft` trained then
    (``SOFT_BUDGET_FILE``); the soft look-alike recipe is that recipe with 15 epochs, SCST from 10 and no cap; the
    objects+counts recipe also without look-alike channels, with cross-entropy and SCST both on the usual scenes."""
    recipe = assert_row_is_recipe("soft look-alike recipe, 14 epochs, SCST from epoch 9, 29.5 minutes (the soft "
                                  "budget recipe)",
                                  "shapes-soft")
    lookalike = flat(resolved(SOFT_LOOKALIKE_ROW))
    assert (lookalike["optim"]["epochs"], lookalike["scst"]["start_epoch"], lookalike["optim"]["time_limit"]) == (15, 10, 1000.0)
    for section, field in (("data", "dataset"), ("scst", "dataset")):
        lookalike[section][field] = recipe[section][field]
    lookalike["optim"]["epochs"], lookalike["scst"]["start_epoch"], lookalike["optim"]["time_limit"] = 14, 9, 29.5
    for field in DECODING:  # chosen on val after these rows were run
        lookalike["model"][field] = recipe["model"][field]
    assert lookalike == recipe
    old = flat(resolved("soft objects-reward recipe, SCST objects+counts over the scene's groups, 15 epochs"))
    assert (old["model"]["lookalike"], old["data"]["dataset"], old["scst"]["dataset"]) == (0, "shapes", None)
    old["model"]["lookalike"], old["data"]["dataset"], old["scst"]["dataset"] = 4, "datasets/shapes-repeats", "shapes"
    old["optim"]["epochs"], old["scst"]["start_epoch"], old["optim"]["time_limit"] = 14, 9, 29.5
    for field in DECODING:
        old["model"][field] = recipe["model"][field]
    assert old == recipe


def test_the_soft_schedule_rows_change_only_their_schedule():
    """The objects+counts recipe's schedule rows are that recipe with only the SCST start (and one the count weight)
    changed."""
    base = flat(resolved("soft objects-reward recipe, SCST objects+counts over the scene's groups, 15 epochs"))
    for name, start, weight in [("soft objects+counts recipe, SCST from epoch 6, 15 epochs", 6, 10.0),
                                ("soft objects+counts recipe, SCST from epoch 4, 15 epochs", 4, 10.0),
                                ("soft objects+counts recipe, SCST from epoch 12, 15 epochs", 12, 10.0),
                                ("soft objects+counts recipe, SCST from epoch 6, count weight 20, 15 epochs",
                                 6, 20.0)]:
        row = flat(resolved(name))
        assert (row["scst"]["start_epoch"], row["scst"]["count_weight"]) == (start, weight)
        row["scst"].update(start_epoch=base["scst"]["start_epoch"], count_weight=base["scst"]["count_weight"])
        assert row == base


@pytest.mark.parametrize("name, field, value", [
    ("soft objects+counts recipe, SCST learning rate 5e-5, 15 epochs", "lr", 5e-5),
    ("soft objects+counts recipe, 10 SCST samples per image, 15 epochs", "samples", 10),
])
def test_the_soft_scst_rows_change_one_setting(name, field, value):
    base = flat(resolved("soft objects-reward recipe, SCST objects+counts over the scene's groups, 15 epochs"))
    row = flat(resolved(name))
    assert row["scst"][field] == value != base["scst"][field]
    row["scst"][field] = base["scst"][field]
    assert row == base


LOCATION_ROW = ("hard objects-reward recipe + number last + location-aware attention, SCST cider+objects+counts "
                "over the scene's groups (from epoch 11), 15 epochs")
# the hard recipe file as it was when the hard objects-reward rows were run
OLD_HARD = Path(__file__).resolve().parent / "data" / "shapes-hard-objects-reward.toml"


def test_the_location_aware_hard_row_changes_only_the_location():
    base = flat(resolved("hard objects-reward recipe + number last, SCST cider+objects+counts over the scene's groups "
                    "(from epoch 11), 15 epochs"))
    row = flat(resolved(LOCATION_ROW))
    assert row["model"]["location"] is True and base["model"]["location"] is False
    row["model"]["location"] = False
    assert row == base


LOOKALIKE_HARD_ROW = "hard location-aware recipe + 4 look-alike channels"


def test_the_hard_budget_row_is_the_hard_recipe():
    """The hard budget recipe is the location-aware one (the location-aware row) with four look-alike channels (the
    look-alike row), cross-entropy on the repeated objects, SCST on the usual scenes, 11 epochs with SCST from 8 and a
    29.5 CPU-minute cap."""
    recipe = assert_row_is_recipe("hard look-alike recipe, cross-entropy on train repeat probability 0.5, SCST on "
                                  "the usual scenes, 11 epochs, SCST from epoch 8, 29.5 minutes (the hard budget "
                                  "recipe)",
                                  "shapes-hard")
    earlier = flat(resolved(LOOKALIKE_HARD_ROW))
    assert (earlier["data"]["dataset"], earlier["scst"]["dataset"]) == ("shapes", None)
    assert recipe["model"]["lookalike"] == 4 and flat(resolved(LOCATION_ROW))["model"]["lookalike"] == 0


@pytest.mark.parametrize("name, field, value", [
    ("hard location-aware recipe, SCST objects+counts (no CIDEr-D term, as the soft recipe)", "reward",
     "objects+counts"),
    ("hard location-aware recipe, SCST from epoch 8", "start_epoch", 8),
])
def test_the_location_aware_hard_rows_change_one_setting(name, field, value):
    base = flat(resolved(LOCATION_ROW))
    row = flat(resolved(name))
    assert row["scst"][field] == value != base["scst"][field]
    row["scst"][field] = base["scst"][field]
    assert row == base


@pytest.mark.parametrize("name", [n for n in counting_ablation.COUNTING if n.startswith("hard objects-reward recipe +")
                                  and n != LOCATION_ROW])
def test_the_earlier_hard_rows_resolve_as_on_the_recipe_they_were_measured_on(name):
    """The hard objects-reward rows started from ``--config shapes-hard`` when it had no location, no number_last
    and the objects reward: pinned now (``_HARD_OBJECTS_REWARD``), they resolve as they did on that recipe file."""
    flags = list(counting_ablation.COUNTING[name])
    pinned = flags[:len(counting_ablation._HARD_OBJECTS_REWARD)]
    assert pinned == counting_ablation._HARD_OBJECTS_REWARD
    rest = [f for f in flags[len(pinned):] if f not in ("--no-location", "--no-number-last")]
    then = flat(from_args(get_args_parser().parse_args(["--config", str(OLD_HARD), *rest, "--out", "x"])))
    now = flat(resolved(name))
    assert now == then


SOFT_OBJECTS_COUNTS_ROW = "soft objects-reward recipe, SCST objects+counts over the scene's groups, 15 epochs"
SOFT_LOOKALIKE_ROW = ("soft objects+counts recipe + 4 look-alike channels, cross-entropy on train repeat "
                      "probability 0.5, SCST on the usual scenes")
HARD_LOOKALIKE_ROW = "hard location-aware recipe + 4 look-alike channels"
HARD_LOOKALIKE_REPEATS_ROW = ("hard look-alike recipe, cross-entropy on train repeat probability 0.5, SCST on the usual "
                      "scenes")
SOFT_BUDGET_ROW = "soft look-alike recipe, 14 epochs, SCST from epoch 9, 29.5 minutes (the soft budget recipe)"
HARD_BUDGET_ROW = ("hard look-alike recipe, cross-entropy on train repeat probability 0.5, SCST on the usual "
                      "scenes, 11 epochs, SCST from epoch 8, 29.5 minutes (the hard budget recipe)")


@pytest.mark.parametrize("name, base, changed", [
    ("soft objects+counts recipe, cross-entropy on train repeat probability 0.5, SCST on the usual scenes",
     SOFT_OBJECTS_COUNTS_ROW, {("data", "dataset"): "shapes-repeats", ("scst", "dataset"): "shapes"}),
    ("hard location-aware recipe, cross-entropy on train repeat probability 0.5, SCST on the usual scenes",
     LOCATION_ROW, {("data", "dataset"): "shapes-repeats", ("scst", "dataset"): "shapes"}),
    ("soft objects+counts recipe, SCST on train repeat probability 0.5 (cross-entropy on the usual scenes)",
     SOFT_OBJECTS_COUNTS_ROW, {("scst", "dataset"): "shapes-repeats"}),
    ("soft objects+counts recipe, a group named in several phrases scores -1 in the count term",
     SOFT_OBJECTS_COUNTS_ROW, {("scst", "split_score"): -1.0}),
    ("hard location-aware recipe, a group named in several phrases scores -1 in the count term",
     LOCATION_ROW, {("scst", "split_score"): -1.0}),
    ("soft objects+counts recipe + 4 look-alike channels", SOFT_OBJECTS_COUNTS_ROW, {("model", "lookalike"): 4}),
    ("hard location-aware recipe + 4 look-alike channels", LOCATION_ROW, {("model", "lookalike"): 4}),
    ("soft objects+counts recipe + 4 look-alike channels, cross-entropy on train repeat probability 0.5, SCST on "
     "the usual scenes", SOFT_OBJECTS_COUNTS_ROW,
     {("model", "lookalike"): 4, ("data", "dataset"): "shapes-repeats", ("scst", "dataset"): "shapes"}),
    ("soft look-alike recipe, batches of whole images", SOFT_LOOKALIKE_ROW,
     {("optim", "group_by_image"): True}),
    ("soft look-alike recipe, cross-entropy on train repeat probability 0.7", SOFT_LOOKALIKE_ROW,
     {("data", "dataset"): "shapes-repeats70"}),
    ("soft look-alike recipe, seed 1", SOFT_LOOKALIKE_ROW, {("run", "seed"): 1}),
    ("hard look-alike recipe, cross-entropy on train repeat probability 0.5, SCST on the usual scenes",
     HARD_LOOKALIKE_ROW, {("data", "dataset"): "shapes-repeats", ("scst", "dataset"): "shapes"}),
    ("soft look-alike recipe, 14 epochs, SCST from epoch 9, 29.5 minutes (the soft budget recipe)", SOFT_LOOKALIKE_ROW,
     {("optim", "epochs"): 14, ("scst", "start_epoch"): 9, ("optim", "time_limit"): 29.5}),
    ("hard look-alike recipe, cross-entropy on train repeat probability 0.5, SCST on the usual scenes, 11 epochs, "
     "SCST from epoch 8, 29.5 minutes (the hard budget recipe)", HARD_LOOKALIKE_REPEATS_ROW,
     {("optim", "epochs"): 11, ("scst", "start_epoch"): 8, ("optim", "time_limit"): 29.5,
      ("optim", "time_clock"): "cpu"}),
    ("hard look-alike recipe, cross-entropy on train repeat probability 0.5, SCST on the usual scenes, batches of "
     "whole images", HARD_LOOKALIKE_ROW,
     {("data", "dataset"): "shapes-repeats", ("scst", "dataset"): "shapes", ("optim", "group_by_image"): True}),
    ("soft budget recipe, SCST split score -1", SOFT_BUDGET_ROW, {("scst", "split_score"): -1.0}),
    ("hard budget recipe, SCST split score -1", HARD_BUDGET_ROW, {("scst", "split_score"): -1.0}),
    ("hard budget recipe, SCST split score -0.5", HARD_BUDGET_ROW,
     {("scst", "split_score"): -0.5}),
    ("soft budget recipe, seed 1, 12 epochs", SOFT_BUDGET_ROW,
     {("run", "seed"): 1, ("optim", "epochs"): 12}),
    ("hard budget recipe, seed 1", HARD_BUDGET_ROW, {("run", "seed"): 1}),
    ("hard budget recipe, seed 1, its 11 epochs without the time cap", HARD_BUDGET_ROW,
     {("run", "seed"): 1, ("optim", "time_limit"): 1000}),
    ("soft budget recipe, seed 2, 12 epochs without the time cap", SOFT_BUDGET_ROW,
     {("run", "seed"): 2, ("optim", "epochs"): 12, ("optim", "time_limit"): 1000}),
    ("soft budget recipe, singular nouns, 12 epochs without the time cap", SOFT_BUDGET_ROW,
     {("model", "singular_nouns"): True, ("optim", "epochs"): 12, ("optim", "time_limit"): 1000}),
    ("hard budget recipe, singular nouns, its 11 epochs without the time cap", HARD_BUDGET_ROW,
     {("model", "singular_nouns"): True, ("optim", "time_limit"): 1000}),
    ("soft budget recipe, 2 near look-alike channels, 12 epochs without the time cap",
     SOFT_BUDGET_ROW, {("model", "lookalike_near"): 2, ("optim", "epochs"): 12, ("optim", "time_limit"): 1000}),
    ("hard budget recipe, 2 near look-alike channels, its 11 epochs without the time cap",
     HARD_BUDGET_ROW, {("model", "lookalike_near"): 2, ("optim", "time_limit"): 1000}),
    ("soft budget recipe, singular nouns, count head, 12 epochs without the time cap",
     SOFT_BUDGET_ROW, {("model", "singular_nouns"): True, ("model", "count_head"): True, ("optim", "epochs"): 12,
                          ("optim", "time_limit"): 1000}),
    ("soft budget recipe, singular nouns, seed 1, 12 epochs without the time cap",
     SOFT_BUDGET_ROW, {("model", "singular_nouns"): True, ("run", "seed"): 1, ("optim", "epochs"): 12,
                          ("optim", "time_limit"): 1000}),
    ("soft budget recipe, singular nouns, count head, seed 1, 12 epochs without the time cap",
     SOFT_BUDGET_ROW, {("model", "singular_nouns"): True, ("model", "count_head"): True, ("run", "seed"): 1,
                          ("optim", "epochs"): 12, ("optim", "time_limit"): 1000}),
])
def test_rows_change_only_their_named_settings(name, base, changed):
    """These rows are their base row with only these settings changed (datasets: by folder name)."""
    row, then = flat(resolved(name)), flat(resolved(base))
    for (section, field), value in changed.items():
        got = row[section][field]
        assert (Path(got).name if field == "dataset" else got) == value
        assert got != then[section][field]
        row[section][field] = then[section][field]
    assert row == then


@pytest.mark.parametrize("kind, weight", [("soft", 5.0), ("hard", 10.0)])
def test_the_inhibition_rows_add_only_inhibition_to_the_uncapped_budget_rows(kind, weight):
    """The inhibition rows: the uncapped budget recipe (the seed rows' epochs) with inhibition of return for
    validation and test, and the self-critical samples drawn with it."""
    name = {"soft": "soft budget recipe, inhibition 5, SCST samples inhibited, 12 epochs without the time cap",
            "hard": "hard budget recipe, inhibition 10, SCST samples inhibited, its 11 epochs without the time cap"}[kind]
    base = {"soft": "soft budget recipe, singular nouns, 12 epochs without the time cap",
            "hard": "hard budget recipe, singular nouns, its 11 epochs without the time cap"}[kind]
    row, earlier = flat(resolved(name)), flat(resolved(base))
    assert (row["model"]["inhibit_named"], row["scst"]["inhibit"]) == (weight, True)
    assert (earlier["model"]["inhibit_named"], earlier["scst"]["inhibit"]) == (0.0, False)
    row["model"]["inhibit_named"], row["scst"]["inhibit"] = 0.0, False
    earlier["model"]["singular_nouns"] = False
    assert row == earlier


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_the_look_alike_supervision_rows_are_the_tuned_budget_recipes_with_it(kind):
    """The look-alike supervision rows resolve to `train.py --config shapes-<kind> --lambda-twin 1` as the recipe
    files stood for the budget recipes with tuned decoding (those settings pinned), data folders named by absolute
    path."""
    row = flat(resolved(f"{kind} budget recipe with tuned decoding, look-alike supervision (lambda 1)"))
    budget_file = BUDGET_FILE[f"shapes-{kind}"]
    recipe = flat(from_args(get_args_parser().parse_args(["--config", f"shapes-{kind}", *budget_file, "--out", "x"])))
    assert row["optim"]["lambda_twin"] == 1.0
    row["optim"]["lambda_twin"] = recipe["optim"]["lambda_twin"]
    for section, field in (("data", "dataset"), ("scst", "dataset")):
        assert Path(row[section][field]).name == Path(recipe[section][field]).name
        row[section][field] = recipe[section][field]
    assert row == recipe


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_the_tuned_budget_rows_change_only_what_their_names_say(kind):
    """The budget recipe with tuned decoding, with singular nouns and the count head (soft), or with
    inhibited SCST samples and the self-critical phase from epoch 6 of 14 (hard); the cap and all else as shipped."""
    name = {"soft": "soft budget recipe with tuned decoding, singular nouns, count head",
            "hard": "hard budget recipe with tuned decoding, SCST samples inhibited, SCST from epoch 6, 14 epochs"}[kind]
    row = flat(resolved(name))
    recipe = flat(resolved(f"{kind} budget recipe with tuned decoding, look-alike supervision (lambda 1)"))
    recipe["optim"]["lambda_twin"] = 0.0
    if kind == "soft":
        assert (row["model"]["singular_nouns"], row["model"]["count_head"]) == (True, True)
        recipe["model"]["singular_nouns"] = recipe["model"]["count_head"] = True
    else:
        assert (row["scst"]["inhibit"], row["scst"]["start_epoch"], row["optim"]["epochs"]) == (True, 6, 14)
        recipe["scst"]["inhibit"], recipe["scst"]["start_epoch"], recipe["optim"]["epochs"] = True, 6, 14
    assert row["optim"]["time_limit"] == 29.5
    assert row == recipe


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_the_combined_rows_add_both_changes_to_each_recipe(kind):
    """The two changes of the rows above together (singular nouns and the count head;
    inhibited SCST samples from epoch 6), decoded without a length penalty; the cap and all else as shipped."""
    name = {"soft": ("soft budget recipe with tuned decoding, singular nouns, count head, SCST samples inhibited, "
                     "SCST from epoch 6, no length penalty"),
            "hard": ("hard budget recipe with tuned decoding, singular nouns, count head, SCST samples inhibited, "
                     "SCST from epoch 6, 14 epochs, no length penalty")}[kind]
    row = flat(resolved(name))
    recipe = flat(resolved(f"{kind} budget recipe with tuned decoding, look-alike supervision (lambda 1)"))
    recipe["optim"]["lambda_twin"] = 0.0
    assert (row["model"]["singular_nouns"], row["model"]["count_head"], row["model"]["length_penalty"]) == (
        True, True, 0.0)
    assert (row["scst"]["inhibit"], row["scst"]["start_epoch"], row["optim"]["epochs"]) == (True, 6, 14)
    recipe["model"]["singular_nouns"] = recipe["model"]["count_head"] = True
    recipe["model"]["length_penalty"] = 0.0
    recipe["scst"]["inhibit"], recipe["scst"]["start_epoch"], recipe["optim"]["epochs"] = True, 6, 14
    assert row["optim"]["time_limit"] == 29.5
    assert row == recipe


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_the_length_penalty_rows_change_only_their_named_settings(kind):
    """The combined rows with the decoding chosen for them on val; soft runs 17 epochs within the same
    cap, hard adds the split score of -1 (a group named in several phrases costs more than a wrong number)."""
    base = {"soft": ("soft budget recipe with tuned decoding, singular nouns, count head, SCST samples inhibited, "
                     "SCST from epoch 6, no length penalty"),
            "hard": ("hard budget recipe with tuned decoding, singular nouns, count head, SCST samples inhibited, "
                     "SCST from epoch 6, 14 epochs, no length penalty")}[kind]
    name = {"soft": ("soft budget recipe with tuned decoding, singular nouns, count head, SCST samples inhibited, "
                     "SCST from epoch 6, 17 epochs, length penalty 1"),
            "hard": ("hard budget recipe with tuned decoding, singular nouns, count head, SCST samples inhibited, "
                     "SCST from epoch 6, 14 epochs, SCST split score -1, length penalty 1, repeat penalty 4")}[kind]
    row, before = flat(resolved(name)), flat(resolved(base))
    before["model"]["length_penalty"] = 1.0
    if kind == "soft":
        assert (before["optim"]["epochs"], row["optim"]["epochs"]) == (14, 17)
        before["optim"]["epochs"] = 17
    else:
        assert (before["model"]["repeat_penalty"], before["scst"]["split_score"]) == (2.0, 0.0)
        before["model"]["repeat_penalty"], before["scst"]["split_score"] = 4.0, -1.0
    assert row["optim"]["time_limit"] == 29.5
    assert row == before


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_the_seed_and_reward_rows_change_only_their_named_settings(kind):
    """The soft length-penalty row with seed 1; the hard length-penalty row with the soft recipe's SCST reward
    (objects + counts, no CIDEr-D term)."""
    base = {"soft": ("soft budget recipe with tuned decoding, singular nouns, count head, SCST samples inhibited, "
                     "SCST from epoch 6, 17 epochs, length penalty 1"),
            "hard": ("hard budget recipe with tuned decoding, singular nouns, count head, SCST samples inhibited, "
                     "SCST from epoch 6, 14 epochs, SCST split score -1, length penalty 1, repeat penalty 4")}[kind]
    change = {"soft": ", seed 1", "hard": ", SCST objects+counts"}[kind]
    row, before = flat(resolved(base + change)), flat(resolved(base))
    if kind == "soft":
        assert (before["run"]["seed"], row["run"]["seed"]) == (0, 1)
        before["run"]["seed"] = 1
    else:
        assert (before["scst"]["reward"], row["scst"]["reward"]) == ("cider+objects+counts", "objects+counts")
        before["scst"]["reward"] = "objects+counts"
    assert row["optim"]["time_limit"] == 29.5
    assert row == before


@pytest.mark.parametrize("seed", [0, 1])
def test_the_18_epoch_hard_rows_are_the_14_epoch_row_run_longer(seed):
    base = ("hard budget recipe with tuned decoding, singular nouns, count head, SCST samples inhibited, SCST from "
            "epoch 6, 14 epochs, SCST split score -1, length penalty 1, repeat penalty 4")
    name = base.replace("14 epochs", "18 epochs") + (", seed 1" if seed else "")
    row, before = flat(resolved(name)), flat(resolved(base))
    assert (before["optim"]["epochs"], row["optim"]["epochs"], row["run"]["seed"]) == (14, 18, seed)
    before["optim"]["epochs"], before["run"]["seed"] = 18, seed
    assert row["optim"]["time_limit"] == 29.5
    assert row == before


def test_the_19_epoch_soft_row_is_the_soft_recipe_with_its_former_reward_and_two_more_epochs():
    """`train.py --config shapes-soft` with its former objects+counts reward and without merged repeats, with two
    more epochs."""
    row = flat(resolved("shapes-soft recipe with the objects+counts reward, 19 epochs, repeats not merged"))
    recipe = flat(from_args(get_args_parser().parse_args(["--config", "shapes-soft", "--out", "x", "--scst-reward",
                                                     "objects+counts", "--scst-object-weight", "10",
                                                     "--scst-count-weight", "10"])))  # its former reward
    assert (recipe["optim"]["epochs"], row["optim"]["epochs"]) == (17, 19)
    assert recipe["model"]["merge_repeats"] and not row["model"]["merge_repeats"]  # the recipe file merges repeats now
    recipe["model"]["merge_repeats"] = False
    recipe["optim"]["epochs"] = 19
    assert row == recipe


def test_the_cider_reward_rows_differ_from_the_soft_recipe_only_in_the_weights_and_patience():
    """The soft recipe with CIDEr-D in its reward at three weights, once with patience 20; the 20 x row is the recipe
    file as it ships."""
    recipe = flat(from_args(get_args_parser().parse_args(["--config", "shapes-soft", "--out", "x"])))
    assert flat(resolved("shapes-soft recipe, SCST cider+objects+counts, 20 x objects and counts"
                    )) == recipe
    for name, weight, patience in [("shapes-soft recipe, SCST cider+objects+counts, 10 x objects and counts", 10.0, 5),
                                   ("shapes-soft recipe, SCST cider+objects+counts, 10 x objects and counts, "
                                    "patience 20",
                                    10.0, 20),
                                   ("shapes-soft recipe, SCST cider+objects+counts, 15 x objects and counts", 15.0, 5)]:
        row = flat(resolved(name))
        assert (row["scst"]["object_weight"], row["scst"]["count_weight"], row["eval"]["patience"]) == \
            (weight, weight, patience)
        row["scst"].update(object_weight=20.0, count_weight=20.0)
        row["eval"]["patience"] = 5
        assert row == recipe
