__version__ = "0.1.0"  # a literal: pyproject.toml reads it without importing the package
