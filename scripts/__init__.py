"""Maintainer tools: choose a checkpoint's decoding settings, ship a run as a checkpoint, screenshot the app. Each
runs from the repository root as ``python -m scripts.<name>``."""
