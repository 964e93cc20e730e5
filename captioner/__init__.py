"""captioner: Show, Attend and Tell image captioning with attention maps you can see."""

from captioner.checkpoint import load
from captioner.config import ModelConfig
from captioner.model import CaptionResult, Captioner

__all__ = ["load", "Captioner", "CaptionResult", "ModelConfig"]
__version__ = "0.1.0"
