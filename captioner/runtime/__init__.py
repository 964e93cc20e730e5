"""Captioning without PyTorch: a folder written by ``captioner-export onnx`` run by ONNX Runtime, numpy and Pillow
(``pip install "captioner[onnx]"``; docs/onnx.md). Nothing on this path imports torch."""

from captioner.runtime.model import OnnxCaptioner, load_onnx

__all__ = ["OnnxCaptioner", "load_onnx"]
