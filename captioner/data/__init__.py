"""Datasets: the Karpathy split JSON format, the synthetic scenes, preparation of real sets, feature caches."""
