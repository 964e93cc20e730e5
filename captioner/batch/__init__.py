"""Batch captioning of image files: inputs, checks, records, resume, several processes (docs/ARCHITECTURE.md)."""
