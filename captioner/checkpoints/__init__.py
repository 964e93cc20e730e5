"""Checkpoint folders: the format, loading, the Hub, the version-1 reader, ONNX export (docs/ARCHITECTURE.md)."""
