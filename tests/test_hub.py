"""Hugging Face Hub conventions, all offline: a repo id resolved from a local Hub cache that the test lays out, an
offline miss that fails with one line, save_pretrained's model card, push_to_hub against a stand-in HfApi."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import captioner
from captioner.checkpoints.folder import save_checkpoint
from captioner.commands.runner import run
from captioner.model.config import ModelConfig
from captioner.errors import CheckpointError
from captioner.checkpoints.hub import is_repo_id, resolve_checkpoint
from captioner.model.captioner import Captioner
from captioner.vocab import Vocabulary

hub_constants = pytest.importorskip("huggingface_hub.constants")
ROOT = Path(__file__).resolve().parents[1]


def tiny_model(words: str = "a red blue circle square") -> Captioner:
    cfg = ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=16, embed_dim=8, attention_dim=8)
    return Captioner(cfg, Vocabulary(words.split())).eval()


def lay_out_hub_cache(cache: Path, repo_id: str, checkpoint: Path) -> Path:
    """What huggingface_hub leaves after a download: blobs named by hash, a snapshot of links to them, refs/main."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()  # 40 hex digits, like a git commit
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in checkpoint.iterdir():
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """An empty Hub cache in tmp_path and offline mode, as HF_HUB_CACHE / HF_HUB_OFFLINE set them at import."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def same_weights(a: Captioner, b: Captioner) -> bool:
    sa, sb = a.decoder.state_dict(), b.decoder.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_load_resolves_a_repo_id_from_the_local_hub_cache(offline_hub, tmp_path):
    model = tiny_model()
    snapshot = lay_out_hub_cache(offline_hub, "someone/tiny-captioner", save_checkpoint(model, tmp_path / "ckpt"))

    assert resolve_checkpoint("someone/tiny-captioner") == snapshot
    loaded = captioner.load("someone/tiny-captioner")
    assert loaded.vocab == model.vocab and same_weights(loaded, model)


def test_an_existing_folder_wins_over_a_repo_id_of_the_same_spelling(offline_hub, tmp_path, monkeypatch):
    lay_out_hub_cache(offline_hub, "runs/soft", save_checkpoint(tiny_model("a red circle"), tmp_path / "hub-copy"))
    local = tiny_model("a blue square star")
    save_checkpoint(local, tmp_path / "work" / "runs" / "soft")
    monkeypatch.chdir(tmp_path / "work")

    assert resolve_checkpoint("runs/soft") == Path("runs/soft")
    assert captioner.load("runs/soft").vocab == local.vocab


def test_an_offline_miss_is_one_line_naming_the_id_and_the_cache(offline_hub, capsys):
    with pytest.raises(CheckpointError) as error:
        captioner.load("someone/not-downloaded")
    message = str(error.value)
    assert len(message.splitlines()) == 1
    assert "someone/not-downloaded" in message and "HF_HUB_OFFLINE" in message and str(offline_hub) in message

    # What a command-line user sees: one line and exit status 2, no traceback.
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint")
    code = run(lambda args: captioner.load(args.checkpoint) and 0, parser, prog="captioner-caption",
               argv=["--checkpoint", "someone/not-downloaded"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("captioner-caption: error: someone/not-downloaded")


@pytest.mark.parametrize("source, expected", [
    ("someone/model", True), ("some.one/model_v1.2", True),
    ("shapes-soft", False),  # bare names are folders (and say "does not exist")
    ("./someone/model", False), ("/abs/model", False), ("runs/a/b", False), ("~/model", False),
    ("someone/../model", False), ("some--one/model", False), ("someone/", False),
])
def test_which_strings_are_repo_ids(source, expected):
    assert is_repo_id(source) is expected
    assert is_repo_id(Path(source)) is False  # a Path object is always a path


def test_a_missing_folder_that_is_no_repo_id_keeps_the_folder_message(offline_hub, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        captioner.load(str(tmp_path / "nowhere" / "at" / "all"))


@pytest.mark.integration
def test_env_vars_are_honoured_by_a_fresh_process_outside_the_repository(tmp_path):
    """HF_HUB_CACHE and HF_HUB_OFFLINE are read when huggingface_hub is imported: check them end to end."""
    model = tiny_model()
    lay_out_hub_cache(tmp_path / "hub", "someone/tiny-captioner", save_checkpoint(model, tmp_path / "ckpt"))
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    code = ("import captioner, json; m = captioner.load('someone/tiny-captioner');"
            "print(json.dumps(m.vocab.itos))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == model.vocab.itos

    env["HF_HUB_CACHE"] = str(tmp_path / "empty")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0 and "HF_HUB_OFFLINE" in done.stderr


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_save_pretrained_writes_a_loadable_folder_with_hub_metadata(tmp_path):
    model = tiny_model()
    results = {"test": {"BLEU-4": 0.6, "CIDEr-D": 3.6, "object_f1": 0.95, "images": 1000, "beam_size": 3}}
    folder = captioner.save_pretrained(model, tmp_path / "out", name="someone/tiny", datasets=["shapes"], results=results,
                                   body="Trained by a test.")

    meta = front_matter((folder / "README.md").read_text())
    assert meta["library_name"] == "captioner"
    assert {"image-captioning", "show-attend-tell", "pytorch"} <= set(meta["tags"])
    assert meta["datasets"] == ["shapes"]
    assert meta["metrics"] == ["bleu", "cider", "f1"]  # what was measured, as Hub metric ids; not counts
    card = (folder / "README.md").read_text()
    assert 'captioner.load("someone/tiny")' in card and "Trained by a test." in card and "| test | 0.600" in card
    loaded = captioner.load(folder)
    assert loaded.vocab == model.vocab and same_weights(loaded, model)

    from huggingface_hub import ModelCard  # the Hub's own reader agrees

    assert ModelCard.load(folder / "README.md").data.library_name == "captioner"


def test_save_pretrained_keeps_a_loaded_models_out_of_domain_check(tmp_path):
    shipped = captioner.load(ROOT / "checkpoints" / "shapes-soft")
    assert shipped.domain is not None
    again = captioner.load(captioner.save_pretrained(shipped, tmp_path / "again"))
    assert again.domain is not None and again.domain.dataset == shipped.domain.dataset
    assert again.domain.threshold == shipped.domain.threshold and torch.equal(again.domain.mean, shipped.domain.mean)
    assert not (captioner.save_pretrained(tiny_model(), tmp_path / "fresh") / "domain.safetensors").exists()  # none to keep


def test_the_card_says_how_many_images_set_the_out_of_domain_threshold(tmp_path):
    from captioner.model.domain import fit_domain

    model = tiny_model()
    g = torch.Generator().manual_seed(0)
    model.domain = fit_domain(torch.randn(30, 4, generator=g), torch.randn(12, 4, generator=g), feature="mean")
    card = (captioner.save_pretrained(model, tmp_path / "out") / "README.md").read_text()
    assert ("Out-of-domain check (`domain.safetensors`): fitted on 30 training images; out-of-domain threshold set "
            "on 12 val images (few: the check is rough).") in card
    assert "Out-of-domain" not in (captioner.save_pretrained(tiny_model(), tmp_path / "none") / "README.md").read_text()


def test_a_card_without_results_claims_no_metrics(tmp_path):
    meta = front_matter((captioner.save_pretrained(tiny_model(), tmp_path / "out") / "README.md").read_text())
    assert "metrics" not in meta and "datasets" not in meta and meta["library_name"] == "captioner"


class FakeHfApi:
    """Stands in for huggingface_hub.HfApi: records the calls and what the uploaded folder held."""
    calls: list = []

    def __init__(self, token=None, **kwargs):
        self.token = token

    def create_repo(self, repo_id, *, private=None, exist_ok=False, **kwargs):
        FakeHfApi.calls.append(("create_repo", repo_id, private, exist_ok))

    def upload_folder(self, *, repo_id, folder_path, commit_message=None, **kwargs):
        files = {p.name: p.read_bytes() for p in Path(folder_path).iterdir()}
        FakeHfApi.calls.append(("upload_folder", repo_id, files, commit_message))
        return "commit-info"


def test_push_to_hub_uploads_the_folder_and_its_card(monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    FakeHfApi.calls = []
    model = tiny_model()
    assert captioner.push_to_hub(model, "someone/tiny", private=True, datasets=["shapes"]) == "commit-info"

    (create, repo_id, private, exist_ok), (upload, repo_id2, files, _) = FakeHfApi.calls
    assert (create, repo_id, private, exist_ok) == ("create_repo", "someone/tiny", True, True)
    assert (upload, repo_id2) == ("upload_folder", "someone/tiny")
    assert {"config.json", "vocab.json", "model.safetensors", "README.md"} <= set(files)
    assert front_matter(files["README.md"].decode())["datasets"] == ["shapes"]

    FakeHfApi.calls = []
    with pytest.raises(CheckpointError, match="not a Hugging Face Hub model id"):
        captioner.push_to_hub(model, "not an id")
    assert FakeHfApi.calls == []
