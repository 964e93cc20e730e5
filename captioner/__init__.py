"""captioner: Show, Attend and Tell image captioning with attention maps you can see.

``captioner.load(folder or "user/name")`` reads a checkpoint folder or a Hugging Face Hub model (captioner.hub);
``Captioner.caption`` captions images; ``Captioner.save_pretrained`` / ``push_to_hub`` share a model.
"""

from captioner._version import __version__
from captioner.loading import load
from captioner.config import ModelConfig
from captioner.model import CaptionResult, Captioner

__all__ = ["load", "Captioner", "CaptionResult", "ModelConfig", "__version__"]
