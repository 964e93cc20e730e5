"""bench/ablation.py's counting rows keep the settings they were measured with, whatever the recipe files say now."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import ablation  # noqa: E402
from captioner.commands.train import get_args_parser  # noqa: E402
from captioner.training.flags import from_args  # noqa: E402


def resolved(name: str):
    return from_args(get_args_parser().parse_args([*ablation.COUNTING[name], "--out", "x"]))


@pytest.mark.parametrize("name, reward, over, epochs, minutes, number_last", [
    ("soft recipe + count head, CE only (4 epochs)", "objects", "named", 4, 1000.0, False),
    ("soft recipe + number last, the recipe's own SCST (objects, from epoch 10)", "objects", "named", 40, 27.0, True),
    ("soft recipe as shipped (number last), seed 1", "objects", "named", 40, 27.0, True),
    ("soft recipe as shipped, SCST objects+counts (the recipe's schedule and selection)", "objects+counts", "named",
     40, 27.0, True),
    ("soft recipe as shipped, SCST cider+objects+counts, 15 epochs", "cider+objects+counts", "named", 15, 1000.0, True),
    ("soft recipe as shipped, SCST objects+counts over the scene's groups, 15 epochs", "objects+counts", "scene", 15,
     1000.0, True),
    ("soft recipe as shipped in session 15, SCST from epoch 6, 15 epochs", "objects+counts", "scene", 15, 1000.0, True),
    ("soft recipe as shipped in session 15, SCST from epoch 4, 15 epochs", "objects+counts", "scene", 15, 1000.0, True),
])
def test_counting_rows_pin_their_settings(name, reward, over, epochs, minutes, number_last):
    cfg = resolved(name)
    assert (cfg.scst.reward, cfg.scst.count_over, cfg.optim.epochs, cfg.optim.time_limit, cfg.model.number_last) == \
        (reward, over, epochs, minutes, number_last)
    assert cfg.optim.time_clock == "cpu"


DECODING = ("inhibit_named", "length_penalty", "repeat_penalty")  # the recipes' decoding settings
# shapes-soft as it stood before session 31 shipped session 30's row (and its decoding chosen on val)
SOFT_BEFORE_31 = ["--no-singular-nouns", "--no-count-head", "--no-scst-inhibit", "--no-merge-repeats", "--epochs", "14",
                  "--scst-from", "9",
                  "--repeat-penalty", "4",
                  "--scst-reward", "objects+counts", "--scst-object-weight", "10", "--scst-count-weight", "10"]  # s39
# shapes-hard as it stood before session 32 shipped session 31's row (and its decoding chosen on val)
HARD_BEFORE_32 = ["--no-singular-nouns", "--no-count-head", "--no-scst-inhibit", "--no-merge-repeats", "--scst-split-score",
                  "0", "--plural-spread", "0", "--epochs", "11", "--scst-from", "8", "--length-penalty", "1.5", "--repeat-penalty", "2"]
BEFORE = {"shapes-soft": SOFT_BEFORE_31, "shapes-hard": HARD_BEFORE_32}


def assert_row_is_recipe(name: str, recipe_name: str) -> dict:
    """The row resolves to what `train.py --config recipe_name` trains (its data folders named by absolute path),
    but for the decoding settings the recipe has held since sessions 25-26 (inhibition of return, length and repeat
    penalties), chosen on val after the shipped run and never used by the rows measured before them; returns the
    recipe's settings."""
    before = BEFORE[recipe_name]
    recipe = from_args(get_args_parser().parse_args(["--config", recipe_name, *before, "--out", "x"])).to_dict()
    row = resolved(name).to_dict()
    for field in DECODING:
        assert row["model"][field] == 0.0 < recipe["model"][field], field
        row["model"][field] = recipe["model"][field]
    for section, field in (("data", "dataset"), ("scst", "dataset")):
        assert Path(row[section][field]).name == Path(recipe[section][field]).name
        row[section][field] = recipe[section][field]
    assert row == recipe
    return recipe


def test_the_shipped_row_is_the_recipe():
    """The row shipped in session 20 resolves to what `train.py --config shapes-soft` trained before session 31
    (``SOFT_BEFORE_31``); session 19's is that
    recipe with 15 epochs, SCST from 10 and no cap; session 15's also without look-alike channels, with
    cross-entropy and SCST both on the usual scenes."""
    recipe = assert_row_is_recipe("soft recipe as shipped in session 19, 14 epochs, SCST from epoch 9, 29.5 minutes",
                                  "shapes-soft")
    s19 = resolved(SHIPPED_SOFT19_ROW).to_dict()
    assert (s19["optim"]["epochs"], s19["scst"]["start_epoch"], s19["optim"]["time_limit"]) == (15, 10, 1000.0)
    for section, field in (("data", "dataset"), ("scst", "dataset")):
        s19[section][field] = recipe[section][field]
    s19["optim"]["epochs"], s19["scst"]["start_epoch"], s19["optim"]["time_limit"] = 14, 9, 29.5
    for field in DECODING:  # added to the recipe in sessions 25-26
        s19["model"][field] = recipe["model"][field]
    assert s19 == recipe
    old = resolved("soft recipe as shipped, SCST objects+counts over the scene's groups, 15 epochs").to_dict()
    assert (old["model"]["lookalike"], old["data"]["dataset"], old["scst"]["dataset"]) == (0, "shapes", None)
    old["model"]["lookalike"], old["data"]["dataset"], old["scst"]["dataset"] = 4, "datasets/shapes-repeats", "shapes"
    old["optim"]["epochs"], old["scst"]["start_epoch"], old["optim"]["time_limit"] = 14, 9, 29.5
    for field in DECODING:
        old["model"][field] = recipe["model"][field]
    assert old == recipe


def test_session16_rows_change_only_their_schedule():
    """Session 16's rows are the session-15 recipe with only the SCST start (and one the count weight) changed."""
    base = resolved("soft recipe as shipped, SCST objects+counts over the scene's groups, 15 epochs").to_dict()
    for name, start, weight in [("soft recipe as shipped in session 15, SCST from epoch 6, 15 epochs", 6, 10.0),
                                ("soft recipe as shipped in session 15, SCST from epoch 4, 15 epochs", 4, 10.0),
                                ("soft recipe as shipped in session 15, SCST from epoch 12, 15 epochs", 12, 10.0),
                                ("soft recipe as shipped in session 15, SCST from epoch 6, count weight 20, 15 epochs",
                                 6, 20.0)]:
        row = resolved(name).to_dict()
        assert (row["scst"]["start_epoch"], row["scst"]["count_weight"]) == (start, weight)
        row["scst"].update(start_epoch=base["scst"]["start_epoch"], count_weight=base["scst"]["count_weight"])
        assert row == base


@pytest.mark.parametrize("name, field, value", [
    ("soft recipe as shipped in session 15, SCST learning rate 5e-5, 15 epochs", "lr", 5e-5),
    ("soft recipe as shipped in session 15, 10 SCST samples per image, 15 epochs", "samples", 10),
])
def test_session16_scst_rows_change_one_setting(name, field, value):
    base = resolved("soft recipe as shipped, SCST objects+counts over the scene's groups, 15 epochs").to_dict()
    row = resolved(name).to_dict()
    assert row["scst"][field] == value != base["scst"][field]
    row["scst"][field] = base["scst"][field]
    assert row == base


LOCATION_ROW = ("hard recipe + number last + location-aware attention, SCST cider+objects+counts over the scene's "
                "groups (from epoch 11), 15 epochs")
OLD_HARD = Path(__file__).resolve().parent / "data" / "shapes-hard-session16.toml"  # the recipe as sessions 8-16 had it


def test_the_location_aware_hard_row_changes_only_the_location():
    base = resolved("hard recipe + number last, SCST cider+objects+counts over the scene's groups (from epoch 11), "
                    "15 epochs").to_dict()
    row = resolved(LOCATION_ROW).to_dict()
    assert row["model"]["location"] is True and base["model"]["location"] is False
    row["model"]["location"] = False
    assert row == base


LOOKALIKE_HARD_ROW = "hard recipe as shipped in session 17 + 4 look-alike channels"


def test_the_hard_row_shipped_in_session_20_is_the_hard_recipe_now():
    """Shipped in session 20: the recipe is session 17's (the location-aware row) with four look-alike channels
    (session 19's row), cross-entropy on the repeated objects, SCST on the usual scenes, 11 epochs with SCST from 8
    and a 29.5 CPU-minute cap."""
    recipe = assert_row_is_recipe("hard recipe as shipped in session 20, 11 epochs, SCST from epoch 8, 29.5 minutes",
                                  "shapes-hard")
    earlier = resolved(LOOKALIKE_HARD_ROW).to_dict()
    assert (earlier["data"]["dataset"], earlier["scst"]["dataset"]) == ("shapes", None)
    assert recipe["model"]["lookalike"] == 4 and resolved(LOCATION_ROW).to_dict()["model"]["lookalike"] == 0


@pytest.mark.parametrize("name, field, value", [
    ("hard recipe as shipped in session 17, SCST objects+counts (no CIDEr-D term, as the soft recipe)", "reward",
     "objects+counts"),
    ("hard recipe as shipped in session 17, SCST from epoch 8", "start_epoch", 8),
])
def test_session17_hard_rows_change_one_setting(name, field, value):
    base = resolved(LOCATION_ROW).to_dict()
    row = resolved(name).to_dict()
    assert row["scst"][field] == value != base["scst"][field]
    row["scst"][field] = base["scst"][field]
    assert row == base


@pytest.mark.parametrize("name", [n for n in ablation.COUNTING if n.startswith("hard recipe +") and n != LOCATION_ROW])
def test_the_earlier_hard_rows_resolve_as_on_the_recipe_they_were_measured_on(name):
    """The hard rows before session 17 started from ``--config shapes-hard`` when it had no location, no number_last
    and the objects reward: pinned now (``_HARD16``), they resolve as they did on that recipe file."""
    flags = list(ablation.COUNTING[name])
    pinned = flags[:len(ablation._HARD16)]
    assert pinned == ablation._HARD16
    rest = [f for f in flags[len(pinned):] if f not in ("--no-location", "--no-number-last")]
    then = from_args(get_args_parser().parse_args(["--config", str(OLD_HARD), *rest, "--out", "x"])).to_dict()
    now = resolved(name).to_dict()
    assert now == then


SHIPPED_SOFT_ROW = "soft recipe as shipped, SCST objects+counts over the scene's groups, 15 epochs"
SHIPPED_SOFT19_ROW = ("soft recipe as shipped in session 15 + 4 look-alike channels, cross-entropy on train repeat "
                      "probability 0.5, SCST on the usual scenes")
SHIPPED_HARD19_ROW = "hard recipe as shipped in session 17 + 4 look-alike channels"
SHIPPED_HARD20_ROW = ("hard recipe as shipped in session 19, cross-entropy on train repeat probability 0.5, SCST on the "
                      "usual scenes")
SHIPPED_SOFT20_ROW = "soft recipe as shipped in session 19, 14 epochs, SCST from epoch 9, 29.5 minutes"
SHIPPED_HARD21_ROW = "hard recipe as shipped in session 20, 11 epochs, SCST from epoch 8, 29.5 minutes"


@pytest.mark.parametrize("name, base, changed", [
    ("soft recipe as shipped in session 15, cross-entropy on train repeat probability 0.5, SCST on the usual scenes",
     SHIPPED_SOFT_ROW, {("data", "dataset"): "shapes-repeats", ("scst", "dataset"): "shapes"}),
    ("hard recipe as shipped in session 17, cross-entropy on train repeat probability 0.5, SCST on the usual scenes",
     LOCATION_ROW, {("data", "dataset"): "shapes-repeats", ("scst", "dataset"): "shapes"}),
    ("soft recipe as shipped in session 15, SCST on train repeat probability 0.5 (cross-entropy on the usual scenes)",
     SHIPPED_SOFT_ROW, {("scst", "dataset"): "shapes-repeats"}),
    ("soft recipe as shipped in session 15, a group named in several phrases scores -1 in the count term",
     SHIPPED_SOFT_ROW, {("scst", "split_score"): -1.0}),
    ("hard recipe as shipped in session 17, a group named in several phrases scores -1 in the count term",
     LOCATION_ROW, {("scst", "split_score"): -1.0}),
    ("soft recipe as shipped in session 15 + 4 look-alike channels", SHIPPED_SOFT_ROW, {("model", "lookalike"): 4}),
    ("hard recipe as shipped in session 17 + 4 look-alike channels", LOCATION_ROW, {("model", "lookalike"): 4}),
    ("soft recipe as shipped in session 15 + 4 look-alike channels, cross-entropy on train repeat probability 0.5, "
     "SCST on the usual scenes", SHIPPED_SOFT_ROW,
     {("model", "lookalike"): 4, ("data", "dataset"): "shapes-repeats", ("scst", "dataset"): "shapes"}),
    ("soft recipe as shipped in session 19, batches of whole images", SHIPPED_SOFT19_ROW,
     {("optim", "group_by_image"): True}),
    ("soft recipe as shipped in session 19, cross-entropy on train repeat probability 0.7", SHIPPED_SOFT19_ROW,
     {("data", "dataset"): "shapes-repeats70"}),
    ("soft recipe as shipped in session 19, seed 1", SHIPPED_SOFT19_ROW, {("run", "seed"): 1}),
    ("hard recipe as shipped in session 19, cross-entropy on train repeat probability 0.5, SCST on the usual scenes",
     SHIPPED_HARD19_ROW, {("data", "dataset"): "shapes-repeats", ("scst", "dataset"): "shapes"}),
    ("soft recipe as shipped in session 19, 14 epochs, SCST from epoch 9, 29.5 minutes", SHIPPED_SOFT19_ROW,
     {("optim", "epochs"): 14, ("scst", "start_epoch"): 9, ("optim", "time_limit"): 29.5}),
    ("hard recipe as shipped in session 20, 11 epochs, SCST from epoch 8, 29.5 minutes", SHIPPED_HARD20_ROW,
     {("optim", "epochs"): 11, ("scst", "start_epoch"): 8, ("optim", "time_limit"): 29.5,
      ("optim", "time_clock"): "cpu"}),
    ("hard recipe as shipped in session 19, cross-entropy on train repeat probability 0.5, SCST on the usual scenes, "
     "batches of whole images", SHIPPED_HARD19_ROW,
     {("data", "dataset"): "shapes-repeats", ("scst", "dataset"): "shapes", ("optim", "group_by_image"): True}),
    ("soft recipe as shipped in session 20, SCST split score -1", SHIPPED_SOFT20_ROW, {("scst", "split_score"): -1.0}),
    ("hard recipe as shipped in session 20, SCST split score -1", SHIPPED_HARD21_ROW, {("scst", "split_score"): -1.0}),
    ("hard recipe as shipped in session 20, SCST split score -0.5", SHIPPED_HARD21_ROW,
     {("scst", "split_score"): -0.5}),
    ("soft recipe as shipped in session 20, seed 1, 12 epochs", SHIPPED_SOFT20_ROW,
     {("run", "seed"): 1, ("optim", "epochs"): 12}),
    ("hard recipe as shipped in session 20, seed 1", SHIPPED_HARD21_ROW, {("run", "seed"): 1}),
    ("hard recipe as shipped in session 20, seed 1, its 11 epochs without the time cap", SHIPPED_HARD21_ROW,
     {("run", "seed"): 1, ("optim", "time_limit"): 1000}),
    ("soft recipe as shipped in session 20, seed 2, 12 epochs without the time cap", SHIPPED_SOFT20_ROW,
     {("run", "seed"): 2, ("optim", "epochs"): 12, ("optim", "time_limit"): 1000}),
    ("soft recipe as shipped in session 20, singular nouns, 12 epochs without the time cap", SHIPPED_SOFT20_ROW,
     {("model", "singular_nouns"): True, ("optim", "epochs"): 12, ("optim", "time_limit"): 1000}),
    ("hard recipe as shipped in session 20, singular nouns, its 11 epochs without the time cap", SHIPPED_HARD21_ROW,
     {("model", "singular_nouns"): True, ("optim", "time_limit"): 1000}),
    ("soft recipe as shipped in session 20, 2 near look-alike channels, 12 epochs without the time cap",
     SHIPPED_SOFT20_ROW, {("model", "lookalike_near"): 2, ("optim", "epochs"): 12, ("optim", "time_limit"): 1000}),
    ("hard recipe as shipped in session 20, 2 near look-alike channels, its 11 epochs without the time cap",
     SHIPPED_HARD21_ROW, {("model", "lookalike_near"): 2, ("optim", "time_limit"): 1000}),
    ("soft recipe as shipped in session 20, singular nouns, count head, 12 epochs without the time cap",
     SHIPPED_SOFT20_ROW, {("model", "singular_nouns"): True, ("model", "count_head"): True, ("optim", "epochs"): 12,
                          ("optim", "time_limit"): 1000}),
    ("soft recipe as shipped in session 20, singular nouns, seed 1, 12 epochs without the time cap",
     SHIPPED_SOFT20_ROW, {("model", "singular_nouns"): True, ("run", "seed"): 1, ("optim", "epochs"): 12,
                          ("optim", "time_limit"): 1000}),
    ("soft recipe as shipped in session 20, singular nouns, count head, seed 1, 12 epochs without the time cap",
     SHIPPED_SOFT20_ROW, {("model", "singular_nouns"): True, ("model", "count_head"): True, ("run", "seed"): 1,
                          ("optim", "epochs"): 12, ("optim", "time_limit"): 1000}),
])
def test_session18_rows_change_only_their_settings(name, base, changed):
    """Session 18's (and later sessions') rows are the shipped recipes with only these settings changed (datasets: by folder name)."""
    row, then = resolved(name).to_dict(), resolved(base).to_dict()
    for (section, field), value in changed.items():
        got = row[section][field]
        assert (Path(got).name if field == "dataset" else got) == value
        assert got != then[section][field]
        row[section][field] = then[section][field]
    assert row == then


@pytest.mark.parametrize("kind, weight", [("soft", 5.0), ("hard", 10.0)])
def test_session25_rows_add_only_inhibition_to_the_uncapped_shipped_rows(kind, weight):
    """Session 25's rows: the uncapped shipped recipe (session 23's seed rows' epochs) with inhibition of return for
    validation and test, and the self-critical samples drawn with it."""
    name = {"soft": "soft recipe as shipped in session 20, inhibition 5, SCST samples inhibited, 12 epochs without "
                    "the time cap",
            "hard": "hard recipe as shipped in session 20, inhibition 10, SCST samples inhibited, its 11 epochs "
                    "without the time cap"}[kind]
    base = {"soft": "soft recipe as shipped in session 20, singular nouns, 12 epochs without the time cap",
            "hard": "hard recipe as shipped in session 20, singular nouns, its 11 epochs without the time cap"}[kind]
    row, earlier = resolved(name).to_dict(), resolved(base).to_dict()
    assert (row["model"]["inhibit_named"], row["scst"]["inhibit"]) == (weight, True)
    assert (earlier["model"]["inhibit_named"], earlier["scst"]["inhibit"]) == (0.0, False)
    row["model"]["inhibit_named"], row["scst"]["inhibit"] = 0.0, False
    earlier["model"]["singular_nouns"] = False
    assert row == earlier


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_session_27_rows_are_the_session_26_recipes_with_look_alike_supervision(kind):
    """Session 27's rows resolve to `train.py --config shapes-<kind> --lambda-twin 1` as the recipes stood after
    session 26 (its decoding settings pinned), data folders named by absolute path."""
    row = resolved(f"{kind} recipe as shipped in session 26, look-alike supervision (lambda 1)").to_dict()
    before = BEFORE[f"shapes-{kind}"]
    recipe = from_args(get_args_parser().parse_args(["--config", f"shapes-{kind}", *before, "--out", "x"])).to_dict()
    assert row["optim"]["lambda_twin"] == 1.0
    row["optim"]["lambda_twin"] = recipe["optim"]["lambda_twin"]
    for section, field in (("data", "dataset"), ("scst", "dataset")):
        assert Path(row[section][field]).name == Path(recipe[section][field]).name
        row[section][field] = recipe[section][field]
    assert row == recipe


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_session_27_second_rows_change_only_what_their_names_say(kind):
    """Session 27's second rows: the session-26 recipe with singular nouns and the count head (soft), or with
    inhibited SCST samples and the self-critical phase from epoch 6 of 14 (hard); the cap and all else as shipped."""
    name = {"soft": "soft recipe as shipped in session 26, singular nouns, count head",
            "hard": "hard recipe as shipped in session 26, SCST samples inhibited, SCST from epoch 6, 14 epochs"}[kind]
    row = resolved(name).to_dict()
    recipe = resolved(f"{kind} recipe as shipped in session 26, look-alike supervision (lambda 1)").to_dict()
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
def test_session_28_rows_add_both_changes_to_each_recipe(kind):
    """Session 28's rows: session 27's two second-round changes together (singular nouns and the count head;
    inhibited SCST samples from epoch 6), decoded without a length penalty; the cap and all else as shipped."""
    name = {"soft": "soft recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST "
                    "from epoch 6, no length penalty",
            "hard": "hard recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST "
                    "from epoch 6, 14 epochs, no length penalty"}[kind]
    row = resolved(name).to_dict()
    recipe = resolved(f"{kind} recipe as shipped in session 26, look-alike supervision (lambda 1)").to_dict()
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
def test_session_30_rows_change_only_their_named_settings(kind):
    """Session 30's rows: session 28's, with the decoding chosen for them on val; soft runs 17 epochs within the same
    cap, hard adds the split score of -1 (a group named in several phrases costs more than a wrong number)."""
    base = {"soft": "soft recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST "
                    "from epoch 6, no length penalty",
            "hard": "hard recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST "
                    "from epoch 6, 14 epochs, no length penalty"}[kind]
    name = {"soft": "soft recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST "
                    "from epoch 6, 17 epochs, length penalty 1",
            "hard": "hard recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST "
                    "from epoch 6, 14 epochs, SCST split score -1, length penalty 1, repeat penalty 4"}[kind]
    row, before = resolved(name).to_dict(), resolved(base).to_dict()
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
def test_session_31_rows_change_only_their_named_settings(kind):
    """Session 31's rows: session 30's soft row with seed 1; session 30's hard row with the soft recipe's SCST reward
    (objects + counts, no CIDEr-D term)."""
    base = {"soft": "soft recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST "
                    "from epoch 6, 17 epochs, length penalty 1",
            "hard": "hard recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST "
                    "from epoch 6, 14 epochs, SCST split score -1, length penalty 1, repeat penalty 4"}[kind]
    change = {"soft": ", seed 1", "hard": ", SCST objects+counts"}[kind]
    row, before = resolved(base + change).to_dict(), resolved(base).to_dict()
    if kind == "soft":
        assert (before["run"]["seed"], row["run"]["seed"]) == (0, 1)
        before["run"]["seed"] = 1
    else:
        assert (before["scst"]["reward"], row["scst"]["reward"]) == ("cider+objects+counts", "objects+counts")
        before["scst"]["reward"] = "objects+counts"
    assert row["optim"]["time_limit"] == 29.5
    assert row == before


@pytest.mark.parametrize("seed", [0, 1])
def test_session_31_hard_rows_are_session_30s_with_18_epochs(seed):
    base = ("hard recipe as shipped in session 26, singular nouns, count head, SCST samples inhibited, SCST from "
            "epoch 6, 14 epochs, SCST split score -1, length penalty 1, repeat penalty 4")
    name = base.replace("14 epochs", "18 epochs") + (", seed 1" if seed else "")
    row, before = resolved(name).to_dict(), resolved(base).to_dict()
    assert (before["optim"]["epochs"], row["optim"]["epochs"], row["run"]["seed"]) == (14, 18, seed)
    before["optim"]["epochs"], before["run"]["seed"] = 18, seed
    assert row["optim"]["time_limit"] == 29.5
    assert row == before


def test_session_32_soft_row_is_the_shipped_soft_recipe_with_19_epochs():
    """Session 32's soft row: `train.py --config shapes-soft` as session 31 shipped it, with two more epochs."""
    row = resolved("soft recipe as shipped in session 31, 19 epochs").to_dict()
    recipe = from_args(get_args_parser().parse_args(["--config", "shapes-soft", "--out", "x", "--scst-reward",
                                                     "objects+counts", "--scst-object-weight", "10",
                                                     "--scst-count-weight", "10"])).to_dict()  # before session 39
    assert (recipe["optim"]["epochs"], row["optim"]["epochs"]) == (17, 19)
    assert recipe["model"]["merge_repeats"] and not row["model"]["merge_repeats"]  # the recipe's since session 33
    recipe["model"]["merge_repeats"] = False
    recipe["optim"]["epochs"] = 19
    assert row == recipe


def test_session39_rows_differ_from_the_shipped_soft_recipe_only_in_the_reward_and_patience():
    """Session 39's rows: the soft recipe with CIDEr-D in its reward; the 20 x row is the recipe as it now ships."""
    recipe = from_args(get_args_parser().parse_args(["--config", "shapes-soft", "--out", "x"])).to_dict()
    assert resolved("soft recipe as shipped in session 31, SCST cider+objects+counts, 20 x objects and counts"
                    ).to_dict() == recipe
    for name, weight, patience in [("soft recipe as shipped in session 31, SCST cider+objects+counts", 10.0, 5),
                                   ("soft recipe as shipped in session 31, SCST cider+objects+counts, patience 20",
                                    10.0, 20),
                                   ("soft recipe as shipped in session 31, SCST cider+objects+counts, 15 x objects "
                                    "and counts", 15.0, 5)]:
        row = resolved(name).to_dict()
        assert (row["scst"]["object_weight"], row["scst"]["count_weight"], row["eval"]["patience"]) == \
            (weight, weight, patience)
        row["scst"].update(object_weight=20.0, count_weight=20.0)
        row["eval"]["patience"] = 5
        assert row == recipe
