"""train.py end to end on the tiny synthetic-scenes fixture: the run folder, --resume, hard attention, bad input."""

import json
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

import captioner
from captioner.commands.train import cli, get_args_parser
from captioner.scenes.plugin import decoding_settings, model_settings, training_settings
from captioner.training.config import TrainConfig
from captioner.training.flags import flag_overrides, from_args

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--encoder", "small_cnn", "--encoder-weights", "none", "--grid", "7", "--hidden-dim", "32", "--embed-dim", "16",
        "--attention-dim", "16", "--batch-size", "16", "--max-train-images", "3", "--max-val-images", "2",
        "--max-caption-len", "8", "--test-beam-size", "2", "--min-word-count", "1", "--cache", "off",
        "--no-progress", "--threads", "1"]


def train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *TINY, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def metrics_lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def soft_run(shapes_json, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("train") / "soft"
    result = train("--dataset", str(shapes_json), "--out", str(run), "--epochs", "2", "--test-splits", "test",
                   "--max-test-images", "5")
    assert result.returncode == 0, result.stderr[-2000:]
    (run / "stdout.txt").write_text(result.stdout)
    return run


def test_run_folder(soft_run):
    for name in ("config.json", "vocab.json", "model.safetensors", "metrics.jsonl", "curves.png", "results_test.json",
                 "last/train_state.pt", "last/model.safetensors"):
        assert (soft_run / name).is_file(), name
    rows = metrics_lines(soft_run)
    assert [r["epoch"] for r in rows] == [1, 2]
    assert all(r["train"]["loss"] > 0 and "CIDEr-D" in r["val"] for r in rows)
    results = json.loads((soft_run / "results_test.json").read_text())
    assert results["metrics"]["images"] == len(results["captions"]) == 5  # --max-test-images 5 of the 12
    assert not (soft_run / "results_test_novel.json").exists()  # not in --test-splits
    saved = TrainConfig.from_recipe(soft_run / "train_config.toml")  # the resolved settings, reusable as --config
    assert saved.model.hidden_dim == 32 and saved.eval.max_test_images == 5 and saved.data.max_train_images == 3
    stdout = (soft_run / "stdout.txt").read_text()
    assert f"python caption.py --checkpoint {soft_run}" in stdout and f"python app.py --checkpoint {soft_run}" in stdout
    assert {"BLEU-4", "CIDEr-D", "METEOR", "object_f1"} <= results["metrics"].keys()


def test_run_folder_loads(soft_run):
    model = captioner.load(soft_run)
    assert model.cfg.attention == "soft" and model.cfg.hidden_dim == 32
    from PIL import Image

    image = Image.new("RGB", (64, 48), (200, 30, 30))
    result = model.caption([image], beam_size=2, max_len=5)[0]
    assert len(result.tokens) <= 5 and result.alphas.shape == (len(result.tokens), 7, 7)


def test_run_folder_has_an_out_of_domain_check_from_its_images(soft_run):
    """No feature cache here (--cache off): the check is fitted from the image files through the best encoder."""
    model = captioner.load(soft_run)
    assert model.domain is not None and model.domain.dataset == "synthetic shapes"
    assert model.domain.info["train_images"] == 3 and model.domain.info["held_out_images"] == 2  # the run's splits
    assert model.domain.mean.shape[0] == 2 * model.cfg.encoder_channels  # this encoder's features
    from PIL import Image

    result = model.caption(Image.new("RGB", (64, 48), (200, 30, 30)), beam_size=1, max_len=3)
    assert result.in_domain is not None and result.domain_score >= 0
    assert "out-of-domain check: " in (soft_run / "stdout.txt").read_text()


def test_resume_continues(soft_run, shapes_json, tmp_path):
    run = Path(shutil.copytree(soft_run, tmp_path / "resumed", symlinks=True))
    result = train("--dataset", str(shapes_json), "--out", str(run), "--epochs", "3", "--test-splits", "", "--resume")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = metrics_lines(run)
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert rows[:2] == metrics_lines(soft_run)  # history kept, not rewritten


@pytest.mark.integration
def test_hard_attention_run(shapes_json, tmp_path):
    run = tmp_path / "hard"
    result = train("--dataset", str(shapes_json), "--out", str(run), "--epochs", "2", "--test-splits", "",
                   "--attention", "hard", "--sample-prob", "1.0", "--lambda-att", "0.5", "--domain-images", "0")
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (run / "domain.safetensors").exists() and "out-of-domain" not in result.stdout  # 0 skips it
    rows = metrics_lines(run)
    assert len(rows) == 2 and all({"entropy", "reinforce", "att"} <= r["train"].keys() for r in rows)
    model = captioner.load(run)
    assert model.cfg.attention == "hard" and (run / "last" / "train_state.pt").is_file()


@pytest.mark.parametrize("reward", ["objects", "cider+objects", "cider+objects+counts"])
@pytest.mark.integration
def test_self_critical_epochs(shapes_json, tmp_path, reward):
    """--scst-from 2: epoch 1 is cross-entropy, epoch 2 samples captions and logs their mean reward."""
    run = tmp_path / "scst"
    result = train("--dataset", str(shapes_json), "--out", str(run), "--epochs", "2", "--test-splits", "",
                   "--scst-from", "2", "--scst-reward", reward, "--scst-samples", "3", "--metric", "object_f1")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = metrics_lines(run)
    assert "ce" in rows[0]["train"] and "reward" not in rows[0]["train"]
    assert "reward" in rows[1]["train"] and "ce" not in rows[1]["train"] and rows[1]["train"]["reward"] >= 0
    assert "reward" in result.stdout and captioner.load(run).cfg.attention == "soft"


@pytest.mark.integration
def test_patience_does_not_skip_the_self_critical_epochs(shapes_json, tmp_path):
    """Cross-entropy that stops improving (learning rate 1e-12: the same score every epoch) would end the run by
    --patience before its scheduled SCST phase; the run goes on to it instead, and patience counts from there."""
    common = ["--dataset", str(shapes_json), "--epochs", "6", "--test-splits", "", "--lr", "1e-12", "--patience", "2",
              "--metric", "object_f1", "--domain-images", "0"]
    plain = train(*common, "--out", str(tmp_path / "ce"))
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert len(metrics_lines(tmp_path / "ce")) == 3 and "early stop" in plain.stdout  # no SCST: stops as before
    run = tmp_path / "scst"
    result = train(*common, "--out", str(run), "--scst-from", "4", "--scst-reward", "objects", "--scst-samples", "2",
                   "--scst-lr", "1e-12")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = metrics_lines(run)  # CE 1-3 (stalled after 3), then SCST 4-5: patience counted from epoch 4, not 1
    assert [("reward" in r["train"]) for r in rows] == [False, False, False, True, True]
    assert "going on to the self-critical epochs from epoch 4" in result.stdout and "early stop" in result.stdout


@pytest.mark.integration
def test_self_critical_epochs_on_another_dataset(shapes_json, tmp_path):
    """--scst-dataset: cross-entropy on one dataset's train split, SCST on another's. Here the training split has
    no objects, so the objects reward can only have been built from the other dataset's scenes."""
    def drop_train_objects(images):
        for r in images:
            if r["split"] == "train":
                r.pop("objects", None)

    edited = _dataset_copy(shapes_json, tmp_path, drop_train_objects)
    common = ["--dataset", str(edited), "--image-root", str(shapes_json.parent), "--epochs", "2", "--test-splits", "",
              "--scst-from", "2", "--scst-reward", "objects", "--scst-samples", "3"]
    _assert_one_line_error(train(*common, "--out", str(tmp_path / "refused")), "--scst-reward", "objects")
    _assert_one_line_error(train(*common, "--out", str(tmp_path / "nowhere"), "--scst-dataset",
                                 str(tmp_path / "nowhere.json")), "nowhere.json")
    run = tmp_path / "scst"
    result = train(*common, "--out", str(run), "--scst-dataset", str(shapes_json))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = metrics_lines(run)
    assert "ce" in rows[0]["train"] and rows[1]["train"]["reward"] >= 0
    assert TrainConfig.from_recipe(run / "train_config.toml").scst.dataset == str(shapes_json)


def test_scst_split_is_cut_like_the_training_split(shapes_json, tmp_path):
    from captioner.errors import DatasetError
    from captioner.training.inputs import load_scst_split, load_splits

    data = {"dataset": str(shapes_json), "max_train_images": 2, "image_root": str(shapes_json.parent)}
    cfg = TrainConfig.from_dict({"data": data})
    train_split, _ = load_splits(cfg.data)
    assert load_scst_split(cfg, train_split) is train_split  # no --scst-dataset: the training split itself
    same = TrainConfig.from_dict({"data": data, "scst": {"dataset": str(shapes_json.parent)}})  # its folder
    assert load_scst_split(same, train_split) is train_split
    copy = _dataset_copy(shapes_json, tmp_path, lambda images: images.reverse())
    other_cfg = TrainConfig.from_dict({"data": data, "scst": {"dataset": str(copy)}})
    with pytest.raises(DatasetError, match="absent"):  # its images beside its JSON, not at the --image-root
        load_scst_split(other_cfg, train_split)
    (tmp_path / "images").symlink_to(shapes_json.parent / "images")
    other = load_scst_split(other_cfg, train_split)
    assert other is not train_split and len(other.records) == 2
    assert [r["filename"] for r in other.records] != [r["filename"] for r in train_split.records]


def _assert_one_line_error(result: subprocess.CompletedProcess, *words: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("train.py: error: ") and "Traceback" not in result.stderr, \
        result.stderr
    for word in words:
        assert word in lines[0]


def _dataset_copy(shapes_json: Path, folder: Path, edit) -> Path:
    data = json.loads(shapes_json.read_text())
    edit(data["images"])
    path = folder / "dataset_edited.json"
    path.write_text(json.dumps(data))
    return path


def drop_val(images):
    images[:] = [r for r in images if r["split"] != "val"]


def drop_refs(images):
    for r in images:
        for sentence in r["sentences"]:
            sentence.pop("refs", None)


def drop_objects(images):
    for r in images:
        r.pop("objects", None)


def lose_an_image(images):
    next(r for r in images if r["split"] == "train")["filename"] = "no_such_image.jpg"


BAD_INPUTS = [("missing dataset", "soft"), ("no val split", "soft"), ("missing image", "soft"),
              ("missing image", "hard"), ("no refs for --lambda-att", "soft"), ("no refs for --number-last", "soft"),
              ("no objects for --metric object_f1", "soft"), ("no objects for --scst-reward objects", "hard")]
FAST_BAD_INPUTS = {("missing dataset", "soft"), ("no objects for --scst-reward objects", "hard")}


# a train.py process each (seconds of imports): two in the fast tier, the rest in the integration tier
@pytest.mark.parametrize("case, attention", [c if c in FAST_BAD_INPUTS
                                             else pytest.param(*c, marks=pytest.mark.integration)
                                             for c in BAD_INPUTS])
def test_bad_input_gives_one_line(shapes_json, tmp_path, case, attention):
    common = ["--out", str(tmp_path / "run"), "--epochs", "1", "--attention", attention,
              "--image-root", str(shapes_json.parent)]
    if case == "missing dataset":
        _assert_one_line_error(train("--dataset", str(tmp_path / "nowhere.json"), *common), "nowhere.json")
    elif case == "no val split":
        _assert_one_line_error(train("--dataset", str(_dataset_copy(shapes_json, tmp_path, drop_val)), *common), "'val'")
    elif case == "no refs for --lambda-att":
        _assert_one_line_error(train("--dataset", str(_dataset_copy(shapes_json, tmp_path, drop_refs)), *common,
                                     "--lambda-att", "1"), "--lambda-att", "refs")
    elif case == "no refs for --number-last":
        _assert_one_line_error(train("--dataset", str(_dataset_copy(shapes_json, tmp_path, drop_refs)), *common,
                                     "--number-last", "--metric", "CIDEr-D"), "--number-last", "refs")
    elif case == "no objects for --metric object_f1":  # used to fail only after a whole epoch
        _assert_one_line_error(train("--dataset", str(_dataset_copy(shapes_json, tmp_path, drop_objects)), *common,
                                     "--metric", "object_f1"), "--metric", "objects")
    elif case == "no objects for --scst-reward objects":
        _assert_one_line_error(train("--dataset", str(_dataset_copy(shapes_json, tmp_path, drop_objects)), *common,
                                     "--scst-from", "1", "--scst-reward", "objects"), "--scst-reward", "objects")
    else:
        _assert_one_line_error(train("--dataset", str(_dataset_copy(shapes_json, tmp_path, lose_an_image)), *common),
                               "no_such_image.jpg")
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_evaluate_cli(tmp_path, shapes_json):
    """python -m captioner.evaluate on a tiny saved model: metrics JSON written; a bad split is one line, exit 2."""
    import json
    import subprocess
    import sys

    from captioner.checkpoints.folder import save_checkpoint
    from captioner.model.config import ModelConfig
    from captioner.decoding.config import DecodingConfig
    from captioner.data.karpathy import KarpathySplit
    from captioner.model.captioner import Captioner
    from captioner.vocab import Vocabulary

    vocab = Vocabulary.build(KarpathySplit.load(shapes_json, "train").all_tokens(), min_count=1)
    model = Captioner(ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=16, embed_dim=8,
                                  attention_dim=8), vocab, decoding=DecodingConfig(max_len=6))
    save_checkpoint(model, tmp_path / "ckpt")
    out = tmp_path / "eval.json"
    base = [sys.executable, "-m", "captioner.evaluate", "--checkpoint", str(tmp_path / "ckpt"), "--dataset",
            str(shapes_json), "--no-meteor", "--no-progress", "--beam-size", "2"]
    res = subprocess.run(base + ["--split", "test", "--out", str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    metrics = json.loads(out.read_text())["metrics"]
    assert {"BLEU-4", "CIDEr-D", "ROUGE-L", "object_f1", "attention_correctness", "attention_uniform"} <= set(metrics)
    assert {"scene_accuracy", "count_accuracy", "count_accuracy_multi", "count_groups"} <= set(metrics)
    assert "scene accuracy" in res.stdout and "count accuracy" in res.stdout
    assert metrics["images"] == 12
    bad = subprocess.run(base + ["--split", "nosuch"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nosuch" in bad.stderr


# ----------------------------------------------------------------------------- settings checked before any work
BAD_FLAGS = [("--metric", "BOGUS"), ("--lr", "-1"), ("--hidden-dim", "0"), ("--batch-size", "0"),
             ("--batch-size", "-1"), ("--dropout", "2"), ("--positional", "3"), ("--threads", "-1"),
             ("--workers", "-1"), ("--max-train-images", "0"), ("--epochs", "0"), ("--scst-samples", "1"),
             ("--attention", "bogus"), ("--encoder", "nosuch"), ("--config", "no-such-recipe"),
             ("--domain-images", "-1"), ("--scst-split-score", "nan"), ("--scst-split-score", "2"),
             ("--scst-split-score", "-1"), ("--lr", "nan"), ("--lookalike", "-1"), ("--lookalike", "1000")]


@pytest.mark.parametrize("flag, value", BAD_FLAGS)
def test_bad_setting_is_one_line_before_any_data_is_read(flag, value, tmp_path, capsys, monkeypatch):
    """Each used to train (--lr -1, --hidden-dim 0), fail after an epoch (--metric) or end in a traceback."""
    import captioner.training.inputs as inputs

    monkeypatch.setattr(inputs, "load_splits", lambda *a: pytest.fail("data was read before the check"))
    monkeypatch.setattr(sys, "argv", ["train.py"])  # the error names the program as it was invoked
    code = cli([flag, value, "--out", str(tmp_path / "run"), "--dataset", str(tmp_path / "nowhere.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("train.py: error: ") and flag in err[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["file", "unwritable"])
def test_out_that_cannot_be_written_is_one_line(where, tmp_path, capsys):
    if where == "file":
        (tmp_path / "afile").write_text("x")
        out = tmp_path / "afile" / "run"
    else:
        out = Path("/proc/no/run")  # refused even to root, unlike a chmod'ed folder
    assert cli(["--out", str(out), "--dataset", str(tmp_path / "nowhere.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0], err


# ----------------------------------------------------------------------------- recipes
def _settings(model: dict, decoding: dict) -> dict:
    """The scenes plug-in's settings of a config's model and decoding sections, defaults filled in (a recipe names
    only some; flags and resolved configs name them all)."""
    return {**asdict(model_settings(model.get("plugin_config", {}))),
            **asdict(decoding_settings(decoding.get("plugin_settings", {})))}


def _with_settings(config: dict) -> dict:
    """A TrainConfig's dict with its plug-in settings' defaults filled in."""
    config["model"]["plugin_config"] = asdict(model_settings(config["model"]["plugin_config"]))
    config["decoding"]["plugin_settings"] = asdict(decoding_settings(config["decoding"]["plugin_settings"]))
    config["plugin"] = asdict(training_settings(config["plugin"]))
    return config


def _card(name: str) -> dict:
    return json.loads((ROOT / "checkpoints" / name / "card.json").read_text())


@pytest.mark.parametrize("name", ["shapes-soft", "shapes-hard"])
def test_shipped_recipe_is_what_trained_the_shipped_checkpoint(name):
    """The recipe resolves to the flags on the card (read on top of the defaults they were given against), and its
    model is the shipped config.json's."""
    import shlex

    card = _card(name)
    assert card["recipe"] == f"recipes/{name}.toml" and "--config recipes/" in card["command"]
    if "train_config" in card:  # shipped from a run's train_config.toml: its resolved settings
        trained = TrainConfig.from_dict({s: dict(v) for s, v in card["train_config"].items()})
    else:  # shipped before recipes: the flags on the defaults they were given against
        flags = get_args_parser().parse_args(shlex.split(card["trained_with"])[2:])
        trained = TrainConfig().updated(flag_overrides(flags))
    recipe = from_args(get_args_parser().parse_args(["--config", f"recipes/{name}.toml"]))
    by_name = from_args(get_args_parser().parse_args(["--config", name]))
    assert by_name.to_dict() == recipe.to_dict()
    for section in ("data", "optim", "hard", "scst", "eval"):
        assert recipe.to_dict()[section] == trained.to_dict()[section], section
    # encoder weights "default" resolved as in the run; the plug-in's settings compared with their defaults filled in
    recipe_model, trained_model = recipe.resolved_model().to_dict(), trained.resolved_model().to_dict()
    assert _settings(recipe_model, {}) == _settings(trained_model, {})
    assert {k: v for k, v in recipe_model.items() if k != "plugin_config"} == \
        {k: v for k, v in trained_model.items() if k != "plugin_config"}
    display = ("out", "progress")  # where the run went and whether it drew progress bars
    assert {k: v for k, v in recipe.to_dict()["run"].items() if k not in display} == \
        {k: v for k, v in trained.to_dict()["run"].items() if k not in display}
    shipped = json.loads((ROOT / "checkpoints" / name / "config.json").read_text())["model"]
    built = recipe.resolved_model().to_dict()
    settings = _settings(built, recipe.resolved_decoding().to_dict())
    for field_name in ("encoder", "encoder_weights", "attention", "score", "positional", "location", "word_query",
                       "embed_dim", "hidden_dim", "attention_dim", "dropout", "gate", "deep_output", "grid"):
        assert built[field_name] == shipped[field_name], field_name
    for field_name in ("count_head", "count_mask", "number_last", "lookalike"):  # absent from configs saved before
        assert settings[field_name] == shipped.get(field_name, False), field_name  # they existed (False == 0)
    for field_name in ("inhibit_named", "repeat_penalty"):  # decoding: as the checkpoint decodes
        assert settings[field_name] == shipped.get(field_name, 0.0), field_name
    assert recipe.resolved_decoding().length_penalty == shipped.get("length_penalty", 0.0)


def test_dataset_shapes_without_config_trains_the_shapes_soft_recipe():
    """``--dataset shapes`` alone: the shapes-soft recipe, on the scenes named (the recipe's cross-entropy scenes are
    datasets/shapes-repeats)."""
    plain = from_args(get_args_parser().parse_args(["--dataset", "shapes", "--out", "runs/x"]))
    recipe = from_args(get_args_parser().parse_args(["--config", "recipes/shapes-soft.toml", "--out", "runs/x",
                                                     "--dataset", "shapes"]))
    assert plain.to_dict() == recipe.to_dict() and plain.model.plugin_config["lookalike"] == 4
    assert plain.optim.lambda_ds == 0 and plain.model.hidden_dim == 256
    photos = from_args(get_args_parser().parse_args(["--dataset", "flickr8k"]))
    assert photos.to_dict() == {**TrainConfig().to_dict(), "data": {**TrainConfig().to_dict()["data"],
                                                                    "dataset": "flickr8k"}}


def test_flags_override_the_recipe_and_print_config_shows_it(capsys, tmp_path):
    assert cli(["--config", "shapes-hard", "--lr", "0.01", "--no-gate", "--out", str(tmp_path / "r"),
                "--print-config"]) == 0
    printed = capsys.readouterr().out
    path = tmp_path / "printed.toml"
    path.write_text(printed)
    cfg = TrainConfig.from_recipe(path)
    assert cfg.optim.lr == 0.01 and cfg.model.gate is False and cfg.model.attention == "hard"
    assert cfg.scst.start_epoch == 8 and not (tmp_path / "r").exists()


@pytest.mark.parametrize("name", ["flickr8k-soft", "flickr8k-hard", "flickr30k-soft", "coco-soft"])
def test_photo_recipes_load_and_validate(name, tmp_path):
    cfg = TrainConfig.from_recipe(name)
    cfg.run.out = str(tmp_path / "run")
    cfg.validate()
    text = (ROOT / "captioner" / "recipes" / f"{name}.toml").read_text()
    assert "NOT MEASURED HERE" in text and cfg.optim.lambda_ds in (0.0, 1.0)


def test_resume_reads_the_runs_own_settings(tmp_path):
    """--resume with no --config starts from the run's train_config.toml; flags still override it."""
    run = tmp_path / "run"
    run.mkdir()
    saved = TrainConfig().updated({"optim": {"lambda_att": 0.5, "epochs": 7}, "model": {"hidden_dim": 32},
                                   "run": {"out": str(run)}})
    (run / "train_config.toml").write_text(saved.to_toml())
    cfg = from_args(get_args_parser().parse_args(["--resume", "--out", str(run), "--epochs", "9"]))
    assert cfg.optim.lambda_att == 0.5 and cfg.model.hidden_dim == 32 and cfg.optim.epochs == 9 and cfg.run.resume
    fresh = from_args(get_args_parser().parse_args(["--out", str(run), "--dataset", "flickr8k"]))
    assert fresh.optim.lambda_att == 0.0  # a fresh run does not inherit the folder's settings


def test_the_15_minute_recipe_is_shapes_soft_with_an_earlier_self_critical_phase():
    """shapes-soft-15min (bench/time_to_quality.py's run) changes only the schedule, the thread count and the run
    folder of the earlier shapes-soft recipe (no look-alike channels, the usual scenes in both phases): the
    same model, data, losses and rewards."""
    fast = from_args(get_args_parser().parse_args(["--config", "shapes-soft-15min"])).to_dict()
    full = from_args(get_args_parser().parse_args(["--config", "shapes-soft", "--lookalike", "0", "--dataset",
                                                   "shapes", "--scst-dataset", "none", "--time-limit", "1000",
                                                   "--inhibit-named", "0", "--length-penalty", "0", "--repeat-penalty",
                                                   "0", "--no-merge-repeats",  # shapes-soft's later decoding settings, off
                                                   "--scst-reward", "objects+counts", "--scst-object-weight", "10",
                                                   "--scst-count-weight", "10"])).to_dict()  # its reward before CIDEr-D joined it
    fast, full = _with_settings(fast), _with_settings(full)
    plugin_config = full["model"]["plugin_config"]
    assert plugin_config["singular_nouns"] and plugin_config["count_head"] and full["plugin"]["scst_inhibit"]
    plugin_config.update(singular_nouns=False, count_head=False)  # what shapes-soft added later
    full["plugin"]["scst_inhibit"] = False
    assert (fast["optim"]["epochs"], fast["scst"]["start_epoch"], fast["run"]["threads"]) == (9, 4, 2)
    fast["optim"]["epochs"], fast["scst"]["start_epoch"] = full["optim"]["epochs"], full["scst"]["start_epoch"]
    fast["run"].update(threads=full["run"]["threads"], out=full["run"]["out"])
    assert fast == full
