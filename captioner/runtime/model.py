"""``OnnxCaptioner``: caption from a folder written by ``captioner-export onnx``, with ONNX Runtime, numpy and
Pillow only (no torch on this path; tests/test_onnx.py runs it with torch made unimportable).

    model = captioner.load_onnx("exported/shapes-soft")
    result = model.caption("scene.png")                # a CaptionResult, as Captioner.caption gives
    info = model.explain("scene.png", beam_size=3)     # word probabilities, alpha per word, beta, n-best

Images are prepared as the PyTorch route does (EXIF, RGB, resize with the checkpoint's filter, normalise); the
search is ``captioner.runtime.search`` (``captioner.decoding.search``'s algorithm on numpy); the plug-in's decoding rules are
its ``decoding_rules`` (the same processors PyTorch applies); the domain check is ``captioner.runtime.domain``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from captioner import plugins
from captioner.decoding.config import MAX_BEAM_SIZE, MAX_CAPTION_LEN, MAX_LENGTH_PENALTY, chain, natural_order
from captioner.errors import CheckpointError, ConfigError
from captioner.images import as_image, prepare_image
from captioner.decoding.results import CaptionResult
from captioner.runtime.domain import NumpyDomainCheck
from captioner.runtime.explain import explain_batch
from captioner.runtime.search import Hypothesis, beam_search_nbest, greedy_decode
from captioner.runtime.state import PER_IMAGE, RowState
from captioner.vocab import Vocabulary

FORMAT, VERSION = "captioner-onnx", 1
FILES = ("encoder.onnx", "decoder_init.onnx", "decoder_step.onnx", "runtime.json", "vocab.json")
FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}
# Images per encoder call, as the PyTorch encoder's chunks: a batch of 32 at once peaked at 935 MiB RSS, 4 at a time
# at 218 MiB, at the same ms/image (shapes-soft, 2 cores)
ENCODER_CHUNK = 4
# Decoder steps of at most this many rows (a few images' beams) run on one thread: one image's step took 0.93 ms on
# one thread and 1.2-1.9 ms on two (bench.decoder_protocol's profile, 2 cores): too little work to split, and the
# hand-over costs more. Larger steps, like the encoder, use every thread given.
SMALL_STEP_ROWS = 12

ImageInput = Image.Image | str | os.PathLike


def load_onnx(folder: str | Path, threads: int | None = None) -> "OnnxCaptioner":
    """The exported model in ``folder``; ``threads``: ONNX Runtime's intra-op threads (None: one per core, and one
    thread for the decoder steps of a few images' beams)."""
    return OnnxCaptioner(folder, threads)


class OnnxCaptioner:
    runtime = "onnx"  # captioner.batch.captioning.caption_paths takes this route for it

    def __init__(self, folder: str | Path, threads: int | None = None):
        import onnxruntime as ort

        folder = Path(folder)
        if not folder.is_dir():
            raise CheckpointError(f"exported model folder {folder} does not exist.")
        for name in FILES:
            if not (folder / name).is_file():
                raise CheckpointError(f"{folder} is not an exported model: it has no {name} (`captioner-export onnx "
                                      f"CHECKPOINT {folder}` writes one from a checkpoint).")
        try:
            meta = json.loads((folder / "runtime.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{folder}/runtime.json is not valid JSON ({e}).") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise CheckpointError(f"{folder}/runtime.json is not a {FORMAT} version {VERSION} description.")
        self.folder, self.meta = folder, meta
        self.vocab = Vocabulary.load(folder / "vocab.json")
        self.model_config = meta["model"]
        self.preprocessing = meta["preprocessing"]
        self.grid = tuple(meta["grid"])
        self.step_spec = {**meta["step"], "extension_state": dict(meta["step"]["extension_state"])}
        self.fixed = dict(meta.get("fixed_decoding", {}))
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # Default: every core. ONNX Runtime's own default counts physical cores, one of this 2-vCPU machine's two,
        # and its encoder then ran at 9.4 ms/image instead of 5.5 (bench.onnx_speed, batch 32)
        options.intra_op_num_threads = int(threads or os.cpu_count() or 1)
        options.inter_op_num_threads = 1
        self.threads = threads

        def session(name: str, opts=options):
            try:
                return ort.InferenceSession(str(folder / name), opts, providers=["CPUExecutionProvider"])
            except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types for a corrupt file
                raise CheckpointError(f"{folder}/{name} is not a model ONNX Runtime can load "
                                      f"({str(e).splitlines()[0][:200]}).") from None

        self.encoder, self.init, self.stepper = (session(n) for n in FILES[:3])
        self.small_stepper = self.stepper  # the step for SMALL_STEP_ROWS rows or fewer
        if threads is None and options.intra_op_num_threads > 1:
            single = ort.SessionOptions()
            single.log_severity_level, single.intra_op_num_threads, single.inter_op_num_threads = 3, 1, 1
            self.small_stepper = session(FILES[2], single)
        self.step_inputs = {i.name for i in self.stepper.get_inputs()}
        self.step_outputs = [o.name for o in self.stepper.get_outputs()]
        self.row_names = (["history"] if self.step_spec["history"] else []) + list(self.step_spec["extension_state"])
        self.init_outputs = [o.name for o in self.init.get_outputs()]
        self.domain = NumpyDomainCheck(folder, meta["domain"]) if meta.get("domain") else None
        self.plugin = plugins.get(self.model_config["plugin"]) if self.model_config.get("plugin") else None
        decoding = meta["decoding"]
        self.decoding = {"beam_size": decoding["beam_size"], "max_len": decoding["max_len"],
                         "length_penalty": decoding["length_penalty"],
                         "plugin_settings": dict(decoding.get("plugin_settings", {}))}
        self.set_decoding()
        self._mean = np.array(self.preprocessing["mean"], dtype=np.float32)[:, None, None]  # (3, 1, 1)
        self._std = np.array(self.preprocessing["std"], dtype=np.float32)[:, None, None]

    # ------------------------------------------------------------------------------------------------ settings
    def set_decoding(self, beam_size: int | None = None, max_len: int | None = None,
                     length_penalty: float | None = None, **plugin_settings) -> None:
        """Change how captions are written (None keeps a setting); as ``Captioner.set_decoding``. A setting baked
        into the exported step (``fixed_decoding`` in runtime.json) cannot change: a ConfigError says so."""
        from captioner.checks import check_float, check_int

        d = dict(self.decoding)
        given = {k: v for k, v in plugin_settings.items() if v is not None}
        for name, value in given.items():
            if name in self.fixed and value != self.fixed[name]:
                raise ConfigError(f"decoding.plugin_settings.{name}", value, f"is fixed at {self.fixed[name]} in "
                                  "this exported model (re-export the checkpoint with the setting changed)")
        beam = check_int("decoding.beam_size", d["beam_size"] if beam_size is None else beam_size, 1, MAX_BEAM_SIZE)
        length = check_int("decoding.max_len", d["max_len"] if max_len is None else max_len, 1, MAX_CAPTION_LEN)
        penalty = check_float("decoding.length_penalty", d["length_penalty"] if length_penalty is None
                              else length_penalty, 0.0, MAX_LENGTH_PENALTY)
        settings = {**d["plugin_settings"], **given}
        scores, captions = [], []
        if self.plugin is not None:
            self.plugin.check_decoding(settings, self.model_config.get("plugin_config", {}),
                                       "decoding.plugin_settings.")
            scores, captions = self.plugin.decoding_rules(self.model_config.get("plugin_config", {}), settings,
                                                          self.vocab.itos)
        elif settings:
            name = sorted(settings)[0]
            raise ConfigError(f"decoding.plugin_settings.{name}", settings[name], "is a plug-in's setting, and the "
                              "model has no plug-in")
        self.decoding = {"beam_size": beam, "max_len": length, "length_penalty": penalty,
                         "plugin_settings": settings}
        self.score_processors, self.caption_processors = scores, captions

    # ------------------------------------------------------------------------------------------------- images
    def transform(self, image: Image.Image) -> np.ndarray:
        """A PIL image -> float32 (3, S, S), as the PyTorch route's ``Captioner.transform``."""
        size = int(self.preprocessing["size"])
        resized = prepare_image(image).resize((size, size), FILTERS[self.preprocessing["interpolation"]])
        pixels = np.asarray(resized, dtype=np.uint8).transpose(2, 0, 1).astype(np.float32) / np.float32(255)
        return (pixels - self._mean) / self._std  # (3, S, S)

    def encode(self, images: np.ndarray) -> np.ndarray:
        """Preprocessed images (B, 3, S, S) -> annotations (B, L, C), ``ENCODER_CHUNK`` images per call."""
        images = np.ascontiguousarray(images, dtype=np.float32)
        parts = [self.encoder.run(None, {"images": images[i:i + ENCODER_CHUNK]})[0]
                 for i in range(0, len(images), ENCODER_CHUNK)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    # ------------------------------------------------------------------------------------------------ decoder
    def init_state(self, annotations: np.ndarray) -> RowState:
        out = dict(zip(self.init_outputs, self.init.run(None, {"annotations": annotations.astype(np.float32)})))
        n, L = annotations.shape[:2]
        rows = {"h": out["h"], "c": out["c"]}
        if self.step_spec["history"]:
            rows["history"] = np.zeros((n, 2, L), np.float32)
        for name, (dtype, shape) in self.step_spec["extension_state"].items():  # DecoderExtension.start: zeros
            rows[name] = np.zeros((n, *shape), dtype=np.dtype(dtype))
        return RowState(rows, {k: out[k] for k in PER_IMAGE})

    def step(self, words: np.ndarray, state: RowState):
        """words (B,) -> (logits (B, V), new state, alpha (B, L), beta (B,) or None)."""
        feed = {"words": words.astype(np.int64), **state.rows, **state.images}
        stepper = self.small_stepper if len(words) <= SMALL_STEP_ROWS else self.stepper
        out = dict(zip(self.step_outputs, stepper.run(None, {k: v for k, v in feed.items() if k in self.step_inputs})))
        rows = {"h": out["h_out"], "c": out["c_out"], **{k: out[f"{k}_out"] for k in self.row_names}}
        beta = out["beta"][:, 0] if "beta" in out else None
        return out["logits"], RowState(rows, state.images, state.group), out["alpha"], beta

    def decode(self, annotations: np.ndarray, beam_size: int | None = None, max_len: int | None = None,
               length_penalty: float | None = None, n_best: int | None = 1,
               measure: bool = False) -> list[list[Hypothesis]]:
        """Per image, its hypotheses best first (one for greedy; ``n_best`` for beam search, None: all);
        ``measure``: beam search records each word's probability, gate and entropy (``Hypothesis.measures``)."""
        d = self.decoding
        beam_size, max_len = beam_size or d["beam_size"], max_len or d["max_len"]
        length_penalty = d["length_penalty"] if length_penalty is None else length_penalty
        v, adjust = self.vocab, chain(self.score_processors)
        if beam_size <= 1:
            return [[h] for h in greedy_decode(self, annotations, v.start_index, v.end_index, max_len, adjust)]
        return beam_search_nbest(self, annotations, v.start_index, v.end_index, beam_size, max_len, length_penalty,
                                 n_best=n_best, adjust=adjust, measure=measure)

    # ------------------------------------------------------------------------------------------------ results
    def natural_order(self, words: Sequence[int]) -> list[int]:
        return natural_order(self.caption_processors, [self.vocab.itos[i] for i in words])[0]

    def to_result(self, hyp: Hypothesis) -> CaptionResult:
        keep, tokens = natural_order(self.caption_processors, [self.vocab.itos[i] for i in hyp.words])
        h, w = self.grid
        alphas = hyp.alphas.reshape(len(hyp.words), h, w) if hyp.words else np.zeros((0, h, w), np.float32)
        if keep != list(range(len(keep))):
            alphas = alphas[keep]
        for processor in self.caption_processors:
            tokens, alphas = processor.rewrite(tokens, alphas)
        return CaptionResult(" ".join(tokens), tokens, alphas, hyp.log_prob)

    def caption_arrays(self, inputs: np.ndarray, beam_size: int | None = None, max_len: int | None = None,
                       length_penalty: float | None = None) -> list[CaptionResult]:
        """Preprocessed images (B, 3, S, S) or annotations (B, L, C) -> one CaptionResult each."""
        annotations = inputs if inputs.ndim == 3 else self.encode(inputs)  # (B, L, C)
        results = [self.to_result(hyps[0]) for hyps in self.decode(annotations, beam_size, max_len, length_penalty)]
        if self.domain is not None:
            for result, (inside, score) in zip(results, self.domain.check(annotations)):
                result.in_domain, result.domain_score = inside, score
        return results

    def caption(self, images: ImageInput | Sequence[ImageInput], beam_size: int | None = None,
                max_len: int | None = None, batch_size: int = 32,
                length_penalty: float | None = None) -> CaptionResult | list[CaptionResult]:
        """One image (PIL or path) -> one CaptionResult; a list -> a list, as ``Captioner.caption``."""
        single = isinstance(images, (Image.Image, str, os.PathLike))
        if not single and not isinstance(images, (list, tuple)):
            raise TypeError(f"caption() takes a PIL image, a path (str or Path) or a list of them, "
                            f"not {type(images).__name__}")
        items = [images] if single else list(images)
        results: list[CaptionResult] = []
        for i in range(0, len(items), batch_size):
            batch = np.stack([self.transform(as_image(item)) for item in items[i:i + batch_size]])
            results += self.caption_arrays(batch, beam_size, max_len, length_penalty)
        return results[0] if single else results

    def explain(self, image: ImageInput, beam_size: int | None = None) -> dict:
        """Everything the explorer shows for one image: the caption, alpha per word (T, h, w), each word's
        probability, the gate beta and attention entropy per word (one teacher-forced pass over the chosen words),
        the n-best list and the domain check (``captioner.runtime.explain.explain_batch``, which the app uses)."""
        return explain_batch(self, self.transform(as_image(image))[None], beam_size)[0]
