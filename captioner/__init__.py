"""captioner: Show, Attend and Tell image captioning with attention maps you can see.

``captioner.load(folder or "user/name")`` reads a checkpoint folder or a Hugging Face Hub model (captioner.checkpoints.hub);
``Captioner.caption`` captions images; ``captioner.save_pretrained(model, folder)`` /
``captioner.push_to_hub(model, "user/name")`` share a model.
``captioner.load_onnx(folder)`` reads a folder written by ``captioner-export onnx`` and captions with ONNX Runtime,
numpy and Pillow only (``captioner.runtime``): no PyTorch needed.

The names are imported when first used, so that ``import captioner.runtime`` works where torch is not installed.
"""

__version__ = "0.1.0"  # a literal: pyproject.toml reads it without importing the package

_LAZY = {"load": "captioner.checkpoints.loading", "ModelConfig": "captioner.model.config",
         "Captioner": "captioner.model.captioner", "CaptionResult": "captioner.decoding.results",
         "load_onnx": "captioner.runtime", "save_pretrained": "captioner.checkpoints.hub",
         "push_to_hub": "captioner.checkpoints.hub"}

__all__ = ["load", "load_onnx", "save_pretrained", "push_to_hub", "Captioner", "CaptionResult", "ModelConfig",
           "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # once: later lookups do not come back here
        return value
    raise AttributeError(f"module 'captioner' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
