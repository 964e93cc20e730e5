"""Hugging Face Hub conventions: a repo id as a checkpoint source, a model card with Hub metadata, uploads.

A checkpoint folder (config.json + vocab.json + model.safetensors) is already laid out like a Hub model
repository; this module adds the three things that make it one:

- ``resolve_checkpoint("user/name")`` finds the folder in the local Hub cache or downloads it
  (``huggingface_hub.snapshot_download``; ``HF_HUB_OFFLINE``, ``HF_HUB_CACHE`` and ``HF_HOME`` are honoured).
  A folder that exists always wins over a repo id of the same spelling.
- ``model_card(...)`` writes README.md with the YAML front matter the Hub reads (library name, tags, datasets,
  metrics), so the repository is found by those filters.
- ``save_pretrained(model, folder)`` / ``push_to_hub(model, repo_id)`` (also ``captioner.save_pretrained`` and
  ``captioner.push_to_hub``) write the folder with its card, and upload it with ``HfApi.upload_folder``; they take
  the model, as open_clip's ``push_to_hf_hub`` does, so the model itself knows nothing of the Hub.

``huggingface_hub`` is imported only when a repo id is used, so local folders never touch it.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from captioner import __version__
from captioner.checkpoints.folder import save_checkpoint
from captioner.errors import CheckpointError
from captioner.files import atomic_write

if TYPE_CHECKING:  # type names
    from captioner.model.domain import DomainCheck
    from captioner.model.captioner import Captioner

# "namespace/name": letters, digits, "-", "_", "." (the Hub's rule); one slash, so "runs/a/b" or "./x" are paths.
# Bare names ("shapes-soft") are always folders here: captioner models on the Hub live under a namespace.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
# What a captioner checkpoint holds; never train_state.pt or anything else large a repository may carry.
CHECKPOINT_PATTERNS = ["*.json", "*.safetensors", "*.md"]
LIBRARY_NAME = "captioner"
TAGS = ["image-captioning", "show-attend-tell", "pytorch"]
# Our metric names -> the Hub's metric ids (https://huggingface.co/metrics); others are kept, lower-cased.
HUB_METRICS = {"BLEU-1": "bleu", "BLEU-2": "bleu", "BLEU-3": "bleu", "BLEU-4": "bleu", "METEOR": "meteor",
               "ROUGE-L": "rouge", "CIDEr-D": "cider", "object_f1": "f1"}


def is_repo_id(source: str | Path) -> bool:
    """True for a string spelled like a Hub model id ("user/name"); a ``Path`` object is always a path."""
    if not isinstance(source, str):
        return False
    return bool(_REPO_ID.fullmatch(source)) and ".." not in source and "--" not in source


def resolve_checkpoint(source: str | Path, revision: str | None = None) -> Path:
    """A local checkpoint folder for ``source``: an existing path as it is, a Hub repo id from the cache or the Hub.

    Anything that is neither an existing path nor spelled like a repo id is returned unchanged, so the caller's
    own check says that the folder does not exist. Raises ``CheckpointError`` (one sentence) when a repo id
    cannot be found: offline and not in the cache, unknown on the Hub, or the Hub unreachable.
    """
    path = Path(source)
    if path.exists() or not is_repo_id(source):
        return path
    repo_id = str(source)
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                            RepositoryNotFoundError, RevisionNotFoundError)
    except ImportError:
        raise CheckpointError(f"{repo_id} is not a checkpoint folder, and huggingface_hub is not installed to "
                              f"fetch it from the Hugging Face Hub (pip install huggingface_hub).") from None

    neither = f"{repo_id} is neither a checkpoint folder nor"
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=CHECKPOINT_PATTERNS,
                                        library_name=LIBRARY_NAME, library_version=__version__))
    except (RepositoryNotFoundError, GatedRepoError):  # before HfHubHTTPError: they are subclasses of it
        raise CheckpointError(f"{neither} a model repository on the Hugging Face Hub that this machine may read "
                              f"(not found, or private or gated without a token).") from None
    except RevisionNotFoundError:
        raise CheckpointError(f"Hugging Face Hub repository {repo_id} has no revision {revision!r}.") from None
    except LocalEntryNotFoundError as e:  # also IncompleteSnapshotError, a subclass
        if type(e).__name__ == "IncompleteSnapshotError":
            raise CheckpointError(f"the cached copy of Hugging Face Hub repository {repo_id} is incomplete and the "
                                  f"Hub cannot be reached to finish it.") from None
        if constants.HF_HUB_OFFLINE:
            raise CheckpointError(f"{neither} a model in the local Hugging Face Hub cache "
                                  f"({constants.HF_HUB_CACHE}), and HF_HUB_OFFLINE=1 forbids downloading it.") from None
        reason = e.__cause__ or e
        raise CheckpointError(f"{neither} a model in the local Hugging Face Hub cache, and the Hub could not be "
                              f"reached ({type(reason).__name__}).") from None
    except (HfHubHTTPError, OSError) as e:
        raise CheckpointError(f"{repo_id}: downloading it from the Hugging Face Hub failed "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}).") from None
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"Hugging Face Hub repository {repo_id} holds no config.json; it is not a captioner "
                              f"checkpoint.")
    return folder


def _yaml_list(key: str, values: Sequence[str]) -> list[str]:
    # JSON strings are YAML scalars: quoting with json.dumps keeps any name (colons, '#') valid YAML.
    return [f"{key}:"] + [f"- {json.dumps(str(v))}" for v in values] if values else []


def domain_line(check: DomainCheck | None) -> str | None:
    """The model card's sentence on the out-of-domain check: how many images fitted it and set its threshold
    (None without a check, or for an older file that does not say)."""
    note = check.threshold_note() if check is not None else None
    if note is None:
        return None
    trained = check.info.get("train_images")
    fitted = f"fitted on {trained} training images; " if trained else ""
    return f"Out-of-domain check (`domain.safetensors`): {fitted}{note}."


def model_card(model: Captioner, *, name: str | None = None, datasets: Sequence[str] = (),
               results: Mapping[str, Mapping[str, Any]] | None = None, body: str | None = None) -> str:
    """README.md for a checkpoint folder: Hub metadata (YAML front matter), what the model is, how to load it.

    ``results`` maps a split to its metrics (``{"test": {"BLEU-4": 0.61, ...}}``, as ``evaluate`` writes);
    only metrics that were measured are listed in the metadata. ``body`` (e.g. how the model was trained) is
    added as it is.
    """
    cfg = model.cfg
    results = {split: dict(values) for split, values in (results or {}).items()}
    measured = [k for values in results.values() for k, v in values.items() if isinstance(v, (int, float))
                and not isinstance(v, bool) and k not in ("beam_size", "images", "train_minutes")]
    metrics = list(dict.fromkeys(HUB_METRICS.get(k, k.lower()) for k in measured))
    tags = [*TAGS, f"{cfg.attention}-attention", cfg.encoder]
    front = ["---", f"library_name: {LIBRARY_NAME}", "pipeline_tag: image-to-text", *_yaml_list("tags", tags),
             *_yaml_list("datasets", list(datasets)), *_yaml_list("metrics", metrics), "---", ""]
    title = name or f"captioner: {cfg.attention} attention on {cfg.encoder}"
    frozen = "frozen" if cfg.fine_tune_from is None else f"fine-tuned from stage {cfg.fine_tune_from}"
    lines = [f"# {title}", "",
             f"Show, Attend and Tell image captioner (Xu et al. 2015): {cfg.attention} attention ({cfg.score} score) "
             f"over a {cfg.grid}x{cfg.grid} grid of `{cfg.encoder}` features ({frozen}), LSTM {cfg.hidden_dim}, "
             f"vocabulary of {len(model.vocab)} words"
             + (f", trained on {', '.join(datasets)}." if datasets else "."), "",
             "## Use", "", "```python", "import captioner", "from PIL import Image", "",
             f'model = captioner.load("{name or "user/name"}")  # a Hub repo id or a local folder',
             'result = model.caption([Image.open("photo.jpg")])[0]',
             "print(result.text)  # result.alphas[i]: where the model looked for result.tokens[i]", "```", "",
             "Files: `config.json` (model and preprocessing), `vocab.json`, `model.safetensors` (no pickle).", ""]
    domain = domain_line(model.domain)
    if domain:
        lines += [domain, ""]
    if body:
        lines += [body.strip(), ""]
    if results:
        keys = list(dict.fromkeys(measured))
        lines += ["## Scores", "", "| split | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        for split, values in results.items():
            cells = [f"{values[k]:.3f}" if isinstance(values.get(k), float) else str(values.get(k, "")) for k in keys]
            lines.append(f"| {split} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(front + lines)


def save_pretrained(model: Captioner, folder: str | Path, *, name: str | None = None, datasets: Sequence[str] = (),
                    results: Mapping[str, Mapping[str, Any]] | None = None, body: str | None = None) -> Path:
    """Write ``model`` as a checkpoint folder with a README.md model card; ``captioner.load(folder)`` reads it.

    The model's out-of-domain check (``model.domain``, attached by ``captioner.load``) is saved with it, so a
    shipped model saved again keeps flagging unlike images; after training on other data, train.py's run folder
    holds a check fitted on that data instead."""

    folder = Path(save_checkpoint(model, folder))
    atomic_write(folder / "README.md", model_card(model, name=name, datasets=datasets, results=results, body=body))
    return folder


def push_to_hub(model: Captioner, repo_id: str, *, private: bool | None = None, token: str | None = None,
                commit_message: str = "Upload captioner checkpoint", datasets: Sequence[str] = (),
                results: Mapping[str, Mapping[str, Any]] | None = None, body: str | None = None) -> Any:
    """Create (if needed) the Hub model repository ``repo_id`` and upload the checkpoint folder and its card.

    Needs a token with write access (``hf auth login`` or ``HF_TOKEN``). Returns huggingface_hub's
    ``CommitInfo``; ``captioner.load(repo_id)`` reads the model back anywhere.
    """
    from huggingface_hub import HfApi

    if not is_repo_id(repo_id):
        raise CheckpointError(f"{repo_id!r} is not a Hugging Face Hub model id; expected 'user/name'.")
    api = HfApi(token=token, library_name=LIBRARY_NAME)
    api.create_repo(repo_id, private=private, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="captioner-push-") as tmp:
        save_pretrained(model, tmp, name=repo_id, datasets=datasets, results=results, body=body)
        return api.upload_folder(repo_id=repo_id, folder_path=tmp, commit_message=commit_message)
