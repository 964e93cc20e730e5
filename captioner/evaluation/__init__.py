"""Scoring a checkpoint: caption metrics, evaluate, controllability (docs/ARCHITECTURE.md)."""
