"""The Show, Attend and Tell network: Captioner, ModelConfig, the decoder and its attention (docs/ARCHITECTURE.md)."""
