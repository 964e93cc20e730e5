"""``Captioner``: encoder + decoder + vocabulary + preprocessing, and its ``caption()`` entry point."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from captioner.beam import Hypothesis, beam_search, greedy_decode
from captioner.config import ModelConfig
from captioner.decoder import Decoder
from captioner.decoding import DecodingConfig, chain, natural_order
from captioner.encoders import ENCODERS, Preprocessing, build_encoder
from captioner.hub import push_to_hub, save_pretrained
from captioner.images import open_image, prepare_image
from captioner.outputs import DecoderOutput
from captioner.results import CaptionResult
from captioner.vocab import Vocabulary


ImageInput = Image.Image | str | os.PathLike  # what caption() takes, alone or in a list


def _as_image(item: ImageInput) -> Image.Image:
    if isinstance(item, Image.Image):
        return item
    if isinstance(item, (str, os.PathLike)):
        return open_image(item)
    raise TypeError(f"caption() takes PIL images or paths (str or Path), not {type(item).__name__}")


class Captioner(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab: Vocabulary, preprocessing: Preprocessing | None = None,
                 encoder_weights: str | None = None, decoding: DecodingConfig | None = None):
        """``encoder_weights`` overrides ``cfg.encoder_weights`` (None in tests: random, never downloads);
        ``decoding``: how captions are written (default ``DecodingConfig()``)."""
        super().__init__()
        self.encoder = build_encoder(cfg.encoder, weights=encoder_weights, grid=cfg.grid)
        # a copy completed from the vocabulary and the encoder: the caller's config is left as it was given
        cfg = dataclasses.replace(cfg, vocab_size=len(vocab), encoder_channels=self.encoder.channels)
        if cfg.fine_tune_from is not None:
            self.encoder.fine_tune(cfg.fine_tune_from)
        self.cfg, self.vocab = cfg, vocab
        self.preprocessing = preprocessing or ENCODERS[cfg.encoder].preprocessing
        self.decoder = Decoder.build(cfg)
        self._transform = None
        self.domain = None  # a captioner.domain.DomainCheck; captioner.load attaches the checkpoint's
        self.decoding = DecodingConfig()
        self.set_decoding(decoding)

    def set_decoding(self, decoding: DecodingConfig | None = None, **settings) -> None:
        """Change how captions are written: a whole ``DecodingConfig``, and/or settings by name (``beam_size``,
        ``max_len``, ``length_penalty``, or the plug-in's; None keeps one as it is). Every later caption uses
        them, and a checkpoint saved afterwards keeps them. A ConfigError if a value is out of range or the model
        cannot use it; nothing changes then."""
        new = (decoding or self.decoding).updated(**settings)
        plugin = self.cfg.plugin_module()
        old, self.decoding = self.decoding, new.validate(plugin, self.cfg.plugin_config)
        try:
            self.score_processors, self.caption_processors = plugin.processors(self) if plugin else ([], [])
        except Exception:
            self.decoding = old
            raise

    @property
    def grid(self) -> tuple[int, int]:
        return self.encoder.grid_size(self.preprocessing.size)  # from the architecture: no dummy forward pass

    @property
    def device(self) -> torch.device:
        return next(self.decoder.parameters()).device

    def transform(self, image: Image.Image) -> torch.Tensor:
        if self._transform is None:
            self._transform = self.preprocessing.transform()
        return self._transform(prepare_image(image))

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Preprocessed images (B, 3, H, W) -> annotations (B, L, C)."""
        return self.encoder(images)

    def annotations(self, inputs: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) are encoded; cached annotations (B, L, C) pass through as float."""
        return inputs.float() if inputs.dim() == 3 else self.encode(inputs)

    def forward(self, inputs: torch.Tensor, captions: torch.Tensor, lengths: torch.Tensor,
                sample_prob: float | None = None, image_of: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher forcing. ``inputs``: images (N, 3, H, W), or cached annotations (N, L, C). ``sample_prob``:
        hard attention's probability of the sampled context in this batch (a training setting). ``image_of``
        (B,): the input each caption describes (None: one caption per input, N = B); each image is encoded once."""
        return self.decoder(self.annotations(inputs), captions, lengths, sample_prob, image_of)

    def optimize_encoder(self, backend: str) -> "Captioner":
        """Run the encoder as ``backend`` ("eager", "channels_last" (the default) or "compile"): the same weights
        and captions, another speed (bench/encoder_backends.py)."""
        self.encoder.set_backend(backend)
        return self

    def fine_tune(self, from_stage: int | None) -> None:
        """Train encoder stages ``from_stage`` on (None: frozen); the config records it, so that a checkpoint
        then saves the encoder's weights too."""
        self.encoder.fine_tune(from_stage)
        self.cfg = dataclasses.replace(self.cfg, fine_tune_from=from_stage)

    @torch.inference_mode()
    def decode(self, annotations: torch.Tensor, beam_size: int | None = None, max_len: int | None = None,
               length_penalty: float | None = None) -> list[Hypothesis]:
        """Greedy (``beam_size`` 1) or beam search; None takes the decoding config's setting."""
        d = self.decoding
        beam_size, max_len = beam_size or d.beam_size, max_len or d.max_len
        length_penalty = d.length_penalty if length_penalty is None else length_penalty
        v, adjust = self.vocab, chain(self.score_processors)
        if beam_size <= 1:
            return greedy_decode(self.decoder, annotations.float(), v.start_index, v.end_index, max_len, adjust)
        return beam_search(self.decoder, annotations.float(), v.start_index, v.end_index, beam_size, max_len,
                           length_penalty, adjust)

    @torch.inference_mode()
    def caption_tensors(self, inputs: torch.Tensor, beam_size: int | None = None, max_len: int | None = None,
                        length_penalty: float | None = None) -> list[CaptionResult]:
        """The one encode -> decode -> result loop, shared by ``caption()``, ``batch.caption_paths`` and
        ``evaluate_split``: preprocessed images (B, 3, H, W) or cached annotations (B, L, C)."""
        annotations = self.annotations(inputs.to(self.device))  # (B, L, C)
        results = [self.to_result(h) for h in self.decode(annotations, beam_size, max_len, length_penalty)]
        if self.domain is not None:  # from the annotations already computed: no second encoder pass
            for result, (inside, score) in zip(results, self.domain.check(annotations)):
                result.in_domain, result.domain_score = inside, score
        return results

    def natural_order(self, words: Sequence[int]) -> list[int]:
        """Where each word of the caption is among the decoder's ``words``: all of them in order, unless a caption
        processor reorders them. Anything reported per decoded word (attention, probability, gate) follows it."""
        return natural_order(self.caption_processors, [self.vocab.itos[i] for i in words])[0]

    def natural_tokens(self, tokens: list[str]) -> list[str]:
        """Decoded words (strings) in the order the caption processors put them."""
        return natural_order(self.caption_processors, tokens)[1]

    def to_result(self, hyp: Hypothesis) -> CaptionResult:
        keep, tokens = natural_order(self.caption_processors, [self.vocab.itos[i] for i in hyp.words])
        h, w = self.grid
        alphas = hyp.alphas.reshape(len(hyp.words), h, w).numpy() if hyp.words else np.zeros((0, h, w), np.float32)
        if keep != list(range(len(keep))):  # words in order need no copy of their maps
            alphas = alphas[keep]
        for processor in self.caption_processors:
            tokens, alphas = processor.rewrite(tokens, alphas)
        return CaptionResult(" ".join(tokens), tokens, alphas, hyp.log_prob)

    @torch.inference_mode()
    def caption(self, images: ImageInput | Sequence[ImageInput], beam_size: int | None = None,
                max_len: int | None = None, batch_size: int = 32, length_penalty: float | None = None) -> CaptionResult | list[CaptionResult]:
        """Caption one image or several: what you pass decides what comes back.

            model.caption(Image.open("cat.jpg"))      # one PIL image (any size or mode) -> one CaptionResult
            model.caption("cat.jpg")                  # a path (str or Path)             -> one CaptionResult
            model.caption(["a.jpg", pil_image])       # a list or tuple of either        -> a list, in order

        Paths are decoded with ``captioner.images.open_image`` (regular files only, size limits checked before
        decoding: an ImageError names the file); a list is read ``batch_size`` images at a time.
        """
        single = isinstance(images, (Image.Image, str, os.PathLike))
        if not single and not isinstance(images, (list, tuple)):
            raise TypeError(f"caption() takes a PIL image, a path (str or Path) or a list of them, "
                            f"not {type(images).__name__}")
        items = [images] if single else list(images)
        results: list[CaptionResult] = []
        for i in range(0, len(items), batch_size):
            pictures = [_as_image(item) for item in items[i:i + batch_size]]
            batch = torch.stack([self.transform(im) for im in pictures])  # (B, 3, H, W)
            results += self.caption_tensors(batch, beam_size, max_len, length_penalty)
        return results[0] if single else results

    def save_pretrained(self, folder: str | Path, **card) -> Path:
        """Write this model as a checkpoint folder with a README.md model card carrying Hub metadata (``card``:
        ``name``, ``datasets``, ``results``, ``body``; ``captioner.hub.model_card``); ``captioner.load`` reads it."""
        return save_pretrained(self, folder, **card)

    def push_to_hub(self, repo_id: str, *, private: bool | None = None, token: str | None = None, **card):
        """Upload to the Hub model repository ``repo_id`` ("user/name"; created if needed; needs a write token:
        ``hf auth login`` or ``HF_TOKEN``). Anyone can then ``captioner.load(repo_id)``."""
        return push_to_hub(self, repo_id, private=private, token=token, **card)
