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

from captioner.decoding.search import Hypothesis, beam_search, greedy_decode
from captioner.model.config import ModelConfig
from captioner.model.decoder import Decoder
from captioner.decoding.config import DecodingConfig, chain, natural_order
from captioner.encoders import ENCODERS, Preprocessing, build_encoder
from captioner.images import as_image, prepare_image
from captioner.model.decoder_output import DecoderOutput
from captioner.decoding.regions import (DEFAULT_FLOOR, DEFAULT_STRENGTH, RegionGuide, RegionStop, Regions, check_region_lists,
                               regions_weights, result_regions)
from captioner.decoding.results import CaptionResult
from captioner.vocab import Vocabulary


ImageInput = Image.Image | str | os.PathLike  # what caption() takes, alone or in a list


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
        self.domain = None  # a captioner.model.domain.DomainCheck; captioner.load attaches the checkpoint's
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
        # where a phrase ends, for captions steered by an ordered list of regions (None: one region only)
        self.phrase_rule = plugin.phrase_rule(self) if plugin else None

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
               length_penalty: float | None = None, regions: Sequence[torch.Tensor] | None = None,
               region_strength: float | None = None) -> list[Hypothesis]:
        """Greedy (``beam_size`` 1) or beam search; None takes the decoding config's setting. ``regions``: per
        image, the weights (R, L) of the regions its caption is steered by (``captioner.decoding.regions``), all images
        with the same number R."""
        d = self.decoding
        beam_size, max_len = beam_size or d.beam_size, max_len or d.max_len
        length_penalty = d.length_penalty if length_penalty is None else length_penalty
        v, guide, adjust = self.vocab, None, chain(self.score_processors)
        if regions is not None:
            guide, adjust = self.steering(regions, region_strength, annotations.device)
        if beam_size <= 1:
            return greedy_decode(self.decoder, annotations.float(), v.start_index, v.end_index, max_len, adjust,
                                 guide)
        return beam_search(self.decoder, annotations.float(), v.start_index, v.end_index, beam_size, max_len,
                           length_penalty, adjust, guide)

    def steering(self, regions: Sequence[torch.Tensor], region_strength: float | None = None,
                 device: torch.device | None = None):
        """(the decoder's ``guide``, the score processors in one) for images steered by region weights (R, L) each,
        all with the same number R: what ``decode`` and the app's explorer pass to greedy and beam search."""
        guide = RegionGuide.start(regions, self.phrase_rule, len(self.vocab),
                                  DEFAULT_STRENGTH if region_strength is None else region_strength, DEFAULT_FLOOR,
                                  device)
        processors = list(self.score_processors)
        if self.phrase_rule is not None:
            processors.append(RegionStop(self.phrase_rule, regions[0].shape[0], self.vocab.end_index))
        return guide, chain(processors)

    @torch.inference_mode()
    def caption_tensors(self, inputs: torch.Tensor, beam_size: int | None = None, max_len: int | None = None,
                        length_penalty: float | None = None, regions: Sequence[torch.Tensor | None] | None = None,
                        region_strength: float | None = None) -> list[CaptionResult]:
        """The one encode -> decode -> result loop, shared by ``caption()``, ``batch.caption_paths`` and
        ``evaluate_split``: preprocessed images (B, 3, H, W) or cached annotations (B, L, C). ``regions``: per
        image, the grid weights (R, L) of the regions that steer its caption (``captioner.decoding.regions.regions_weights``)
        or None for a caption as the model would write it; ``region_strength``: the bias' exponent (None: the
        default)."""
        annotations = self.annotations(inputs.to(self.device))  # (B, L, C)
        if regions is None or all(r is None for r in regions):
            results = [self.to_result(h) for h in self.decode(annotations, beam_size, max_len, length_penalty)]
        else:
            results = self._steered(annotations, regions, beam_size, max_len, length_penalty, region_strength)
        if self.domain is not None:  # from the annotations already computed: no second encoder pass
            for result, (inside, score) in zip(results, self.domain.check(annotations)):
                result.in_domain, result.domain_score = inside, score
        return results

    def _steered(self, annotations: torch.Tensor, regions: Sequence[torch.Tensor | None], beam_size, max_len,
                 length_penalty, region_strength) -> list[CaptionResult]:
        """Images decoded in groups of the same number of regions (the stop rule counts phrases per group)."""
        if len(regions) != annotations.shape[0]:
            raise ValueError(f"{len(regions)} region lists for {annotations.shape[0]} images")
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(regions):
            groups.setdefault(0 if r is None else r.shape[0], []).append(i)
        results: list[CaptionResult | None] = [None] * len(regions)
        for count, rows in groups.items():
            idx = torch.tensor(rows, device=annotations.device)
            weights = None if count == 0 else [regions[i].to(annotations.device) for i in rows]
            hyps = self.decode(annotations[idx], beam_size, max_len, length_penalty, weights, region_strength)
            for i, hyp in zip(rows, hyps):
                results[i] = self.to_result(hyp, regions[i])
        return results

    def natural_order(self, words: Sequence[int]) -> list[int]:
        """Where each word of the caption is among the decoder's ``words``: all of them in order, unless a caption
        processor reorders them. Anything reported per decoded word (attention, probability, gate) follows it."""
        return natural_order(self.caption_processors, [self.vocab.itos[i] for i in words])[0]

    def natural_tokens(self, tokens: list[str]) -> list[str]:
        """Decoded words (strings) in the order the caption processors put them."""
        return natural_order(self.caption_processors, tokens)[1]

    def to_result(self, hyp: Hypothesis, regions: torch.Tensor | None = None) -> CaptionResult:
        """The caption of a hypothesis, its words in the caption processors' order; ``regions``: the weights
        (R, L) of the regions that steered it, whose index each word then carries."""
        keep, tokens = natural_order(self.caption_processors, [self.vocab.itos[i] for i in hyp.words])
        h, w = self.grid
        alphas = hyp.alphas.reshape(len(hyp.words), h, w).numpy() if hyp.words else np.zeros((0, h, w), np.float32)
        if keep != list(range(len(keep))):  # words in order need no copy of their maps
            alphas = alphas[keep]
        for processor in self.caption_processors:
            tokens, alphas = processor.rewrite(tokens, alphas)
        where = None if regions is None else result_regions(self.phrase_rule, hyp.words, keep, alphas, regions)
        return CaptionResult(" ".join(tokens), tokens, alphas, hyp.log_prob, regions=where)

    @torch.inference_mode()
    def caption(self, images: ImageInput | Sequence[ImageInput], beam_size: int | None = None,
                max_len: int | None = None, batch_size: int = 32, length_penalty: float | None = None,
                regions: Regions | Sequence[Regions | None] | None = None,
                region_strength: float | None = None) -> CaptionResult | list[CaptionResult]:
        """Caption one image or several: what you pass decides what comes back.

            model.caption(Image.open("cat.jpg"))      # one PIL image (any size or mode) -> one CaptionResult
            model.caption("cat.jpg")                  # a path (str or Path)             -> one CaptionResult
            model.caption(["a.jpg", pil_image])       # a list or tuple of either        -> a list, in order

        Paths are decoded with ``captioner.images.open_image`` (regular files only, size limits checked before
        decoding: an ImageError names the file); a list is read ``batch_size`` images at a time.

        ``regions`` steer what the caption is about (``captioner.decoding.regions``): for one image, a box
        ``[x0, y0, x1, y1]`` in its pixels or an ordered list of boxes (each phrase describes the next one);
        for a list of images, one such entry per image (None: as the model would caption it). The result's
        ``regions`` then give each word's region.
        """
        single = isinstance(images, (Image.Image, str, os.PathLike))
        if not single and not isinstance(images, (list, tuple)):
            raise TypeError(f"caption() takes a PIL image, a path (str or Path) or a list of them, "
                            f"not {type(images).__name__}")
        items = [images] if single else list(images)
        per_image = None if regions is None else check_region_lists(regions, len(items), single)
        results: list[CaptionResult] = []
        for i in range(0, len(items), batch_size):
            pictures = [as_image(item) for item in items[i:i + batch_size]]
            batch = torch.stack([self.transform(im) for im in pictures])  # (B, 3, H, W)
            weights = None if per_image is None else [
                None if boxes is None else regions_weights(boxes, self.grid, prepare_image(im).size)
                for boxes, im in zip(per_image[i:i + batch_size], pictures)]
            results += self.caption_tensors(batch, beam_size, max_len, length_penalty, weights, region_strength)
        return results[0] if single else results
