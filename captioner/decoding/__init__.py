"""How a model writes its captions: DecodingConfig, the search rules, the search, regions, results (docs/ARCHITECTURE.md)."""
