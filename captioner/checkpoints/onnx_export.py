"""A loaded ``Captioner`` as three ONNX graphs that ONNX Runtime runs without PyTorch (``captioner.runtime``).

    encoder.onnx       images (B, 3, S, S) float32 -> annotations (B, L, C)
    decoder_init.onnx  annotations (n, L, C) -> h, c (n, H), and the per-image tensors every step reads:
                       annotations' (n, L, C'), keys (n, L, A), values (n, L, C')
    decoder_step.onnx  one word for every row: words (B,), h, c, the per-image tensors (n images, B = n * g rows,
                       g consecutive rows per image as in beam search), the row state (location-aware attention's
                       history, the decoder extension's state) -> logits and log_probs (B, V), alpha (B, L), beta
                       (B, 1) (the gate, models with one), h', c' and the new row state

The step is ``Decoder.step`` itself, traced: the same attention, gate, deep output and extension hooks. The
extension's decoding state (``DecoderExtension.start``) travels as the fields of its dataclass, rows first.
``export`` checks every graph against PyTorch on sample inputs (several batch and group sizes) and raises
ExportError, writing nothing, when an output differs by more than ``TOLERANCE``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from captioner.model.decoder import State
from captioner.errors import CaptionerError
from captioner.model.captioner import Captioner

FORMAT = "captioner-onnx"
VERSION = 1
OPSET = 17
TOLERANCE = 1e-4  # largest difference of any checked output, relative to its largest magnitude where that is over 1
FILES = ("encoder.onnx", "decoder_init.onnx", "decoder_step.onnx")
OPTIONAL_FILES = ("domain.npz", "MODEL_CARD.md", "checkpoint_config.json")


class ExportError(CaptionerError):
    """A model, or one of its options, that cannot be exported or whose export does not match PyTorch."""


class EncoderGraph(nn.Module):
    """``Encoder.feature_map`` for one input size. Its adaptive poolings become fixed average poolings (the traced
    graph loses the feature maps' sides, which adaptive pooling needs); a side the grid does not divide cannot."""

    def __init__(self, encoder, grid: tuple[int, int], size: int):
        super().__init__()
        self.encoder, self.grid = encoder, grid
        with torch.no_grad():  # the side of every map that is pooled, at this input size
            x, sides = torch.zeros(1, 3, size, size), []
            for i, stage in enumerate(encoder.stages):
                x = stage(x)
                if i in encoder.taps:
                    sides.append(tuple(x.shape[-2:]))
            sides.append(tuple(x.shape[-2:]))
        self.kernels = []  # (k_h, k_w): average k x k cells; negative: repeat each cell -k times (a small map)
        for side in sides:
            if side[0] % grid[0] == 0 and side[1] % grid[1] == 0:
                self.kernels.append((side[0] // grid[0], side[1] // grid[1]))
            elif grid[0] % side[0] == 0 and grid[1] % side[1] == 0:  # adaptive pooling up to the grid repeats cells
                self.kernels.append((-(grid[0] // side[0]), -(grid[1] // side[1])))
            else:
                raise ExportError(f"encoder {type(encoder).__name__}: a {side[0]}x{side[1]} feature map pooled to "
                                  f"the {grid[0]}x{grid[1]} grid (adaptive pooling where neither side divides the "
                                  "other) cannot export.")

    def _pool(self, x: torch.Tensor, kernel: tuple[int, int]) -> torch.Tensor:
        if kernel == (1, 1):
            return x
        if kernel[0] < 0:
            return x.repeat_interleave(-kernel[0], 2).repeat_interleave(-kernel[1], 3)  # (B, C, h, w)
        return nn.functional.avg_pool2d(x, kernel, kernel)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x, tapped = images, []  # (B, 3, S, S)
        for i, stage in enumerate(self.encoder.stages):
            x = stage(x)
            if i in self.encoder.taps:
                tapped.append(x)
        if self.encoder.grid or tapped:
            x = self._pool(x, self.kernels[-1])  # (B, C_last, h, w)
        if tapped:
            x = torch.cat([self._pool(t, k) for t, k in zip(tapped, self.kernels)] + [x], 1)  # (B, C, h, w)
        return x.flatten(2).transpose(1, 2)  # (B, L, C)


class InitGraph(nn.Module):
    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, annotations: torch.Tensor):
        state = self.decoder.init_state(annotations, decoding=True)
        return state.h, state.c, state.annotations, state.keys, state.values


class StepGraph(nn.Module):
    """``Decoder.step`` on flat tensors. ``extra_type``/``extra_fields``: the extension's state dataclass."""

    def __init__(self, decoder, history: bool, extra_type, extra_fields: list[str]):
        super().__init__()
        self.decoder, self.history, self.extra_type, self.extra_fields = decoder, history, extra_type, extra_fields

    def forward(self, words, h, c, annotations, keys, values, *row_state):
        history = row_state[0] if self.history else None
        extra = None
        if self.extra_type is not None:
            extra = self.extra_type(**dict(zip(self.extra_fields, row_state[int(self.history):])))
        group = h.shape[0] // annotations.shape[0]  # traced: rows per image
        state = State(h, c, annotations, keys, values, history, group, extra)
        # With autograd on, the step takes nn.LSTMCell and the attention's plain (unchunked) paths, which export;
        # the no-grad fast paths (a gate table indexed by word, a chunked loop) compute the same values.
        with torch.enable_grad():
            beta = torch.sigmoid(self.decoder.f_beta(h)) if self.decoder.f_beta is not None else None  # (B, 1)
            logits, new, alpha, _ = self.decoder.step(words, state)  # (B, V), State, (B, L)
        out = [logits, logits.log_softmax(-1), alpha] + ([beta] if beta is not None else []) + [new.h, new.c]
        if self.history:
            out.append(new.history)
        if extra is not None:
            out += [getattr(new.extra, f) for f in self.extra_fields]
        return tuple(out)


def unsupported_options(model: Captioner) -> list[str]:
    """The options of ``model`` that this export cannot carry, each as "name: why" (empty: it exports)."""
    cfg, problems = model.cfg, []
    if cfg.attention == "none":
        problems.append("attention none: its step reads no keys (an empty tensor ONNX Runtime is not checked on)")
    plugin = cfg.plugin_module()
    if plugin is not None:
        torch_side = [type(p).__name__ for p in model.score_processors + model.caption_processors]
        scores, captions = plugin.decoding_rules(cfg.plugin_config, model.decoding.plugin_settings, model.vocab.itos)
        light = [type(p).__name__ for p in scores + captions]
        if torch_side != light:
            problems.append(f"plug-in {cfg.plugin}: decoding processors {torch_side} but its torch-free "
                            f"decoding_rules give {light}")
    return problems


def extension_settings(model: Captioner) -> list[str]:
    """The plug-in decoding settings that change the decoder extension (e.g. a weight it applies at every step):
    found by changing each one and looking at the extension's plain attributes."""
    extension = model.decoder.extension
    if extension is None:
        return []

    def snapshot() -> dict:
        return {k: v for k, v in vars(extension).items() if isinstance(v, (bool, int, float, str))}

    original, before, found = model.decoding, snapshot(), []
    for name, value in original.plugin_settings.items():
        if isinstance(value, bool):
            other = not value
        elif isinstance(value, (int, float)):
            other = value * 2 + 1
        else:
            continue
        try:
            model.set_decoding(**{name: other})
        except CaptionerError:
            continue
        if snapshot() != before:
            found.append(name)
        model.set_decoding(original)
    return found


def _extra_spec(model: Captioner, annotations: torch.Tensor):
    """(the extension state's dataclass or None, its field names, {name: [dtype, trailing shape]}); the runtime
    starts each field at zeros, so a state that does not start at zeros cannot export."""
    extra = model.decoder.init_state(annotations, decoding=True).extra
    if extra is None:
        return None, [], {}
    if not dataclasses.is_dataclass(extra):
        raise ExportError(f"the decoder extension's decoding state is a {type(extra).__name__}, not a dataclass "
                          "of tensors: the step graph cannot carry it.")
    names, specs = [f.name for f in dataclasses.fields(extra)], {}
    for name in names:
        value = getattr(extra, name)
        if not isinstance(value, torch.Tensor) or value.shape[0] != annotations.shape[0] or bool(value.any()):
            raise ExportError(f"the decoder extension's decoding state field {name!r} is not a tensor of zeros with "
                              "one row per image: the runtime cannot start it.")
        specs[name] = [str(value.dtype).removeprefix("torch."), list(value.shape[1:])]
    return type(extra), names, specs


def _export(module: nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
            axes: dict[str, dict[int, str]]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about shapes: the self-check below is the test
        try:
            torch.onnx.export(module, args, str(path), dynamo=False, input_names=inputs, output_names=outputs,
                              dynamic_axes=axes, opset_version=OPSET, do_constant_folding=True)
        except (RuntimeError, torch.onnx.errors.OnnxExporterError) as e:  # the exporter's message: a page of graph
            first = str(e).split("[Caused by")[0].strip().splitlines()[0][:300]
            raise ExportError(f"{path.stem}: an operation of this model does not export to ONNX ({first}).") from e


def _session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _compare(name: str, ours: dict[str, np.ndarray], theirs: dict[str, torch.Tensor], report: dict) -> None:
    for key, value in theirs.items():
        expected = value.detach().float().numpy() if value.dtype != torch.bool else value.numpy()
        got = ours[key]
        if got.shape != expected.shape:
            raise ExportError(f"{name}: output {key} has shape {got.shape} in ONNX Runtime, {expected.shape} in "
                              "PyTorch (a shape the trace fixed).")
        if expected.dtype == bool:
            diff = float((got != expected).sum())
        else:
            finite = np.isfinite(expected)
            if not np.array_equal(finite, np.isfinite(got)):
                raise ExportError(f"{name}: output {key} is not finite where PyTorch's is (or the reverse).")
            scale = max(1.0, float(np.abs(expected[finite]).max())) if finite.any() else 1.0
            diff = float(np.abs(got[finite] - expected[finite]).max()) / scale if finite.any() else 0.0
        report[f"{name}.{key}"] = max(diff, report.get(f"{name}.{key}", 0.0))
        if diff > TOLERANCE:
            raise ExportError(f"{name}: output {key} differs from PyTorch by {diff:.2e} (tolerance {TOLERANCE:.0e}); "
                              "nothing was written.")


def export(model: Captioner, out: str | Path, source: str = "", extra_files: dict[str, Path] | None = None,
           seed: int = 0) -> dict:
    """Write ``out``/{encoder, decoder_init, decoder_step}.onnx and runtime.json (+ vocab.json, domain.npz) after
    checking them against ``model``; returns the check's largest differences. ExportError names an option that
    cannot export, or an output beyond TOLERANCE; nothing is written then."""
    problems = unsupported_options(model)
    if problems:
        raise ExportError("cannot export: " + "; ".join(problems) + ".")
    model = model.eval().cpu()
    out = Path(out)
    gen = torch.Generator().manual_seed(seed)
    size = model.preprocessing.size
    grid = model.grid
    L = grid[0] * grid[1]
    with tempfile.TemporaryDirectory(prefix=".onnx-", dir=out.parent if out.parent.exists() else None) as tmp:
        tmp = Path(tmp)
        images = torch.randn(2, 3, size, size, generator=gen)  # (2, 3, S, S)
        encoder = EncoderGraph(model.encoder, grid, size).eval()
        _export(encoder, (images,), tmp / "encoder.onnx", ["images"], ["annotations"],
                {"images": {0: "batch"}, "annotations": {0: "batch"}})
        with torch.no_grad():
            sample = model.encode(images).float()  # (2, L, C) the real encoder, any backend
        C = sample.shape[-1]
        decoder = model.decoder
        extra_type, extra_fields, extra_specs = _extra_spec(model, sample)
        history = decoder.cfg.location and decoder.attention is not None
        per_image = ["annotations_in", "keys", "values"]
        _export(InitGraph(decoder).eval(), (sample,), tmp / "decoder_init.onnx", ["annotations"],
                ["h", "c", *per_image], {"annotations": {0: "images"}, **{k: {0: "images"} for k in
                                                                         ["h", "c", *per_image]}})
        row_in = (["history"] if history else []) + extra_fields
        step_in = ["words", "h", "c", *per_image, *row_in]
        step_out = ["logits", "log_probs", "alpha"] + (["beta"] if decoder.f_beta is not None else []) + \
            ["h_out", "c_out"] + [f"{k}_out" for k in row_in]
        per_row = ["words", "h", "c", *row_in, *step_out]
        axes = {**{k: {0: "rows"} for k in per_row}, **{k: {0: "images"} for k in per_image}}
        example = _step_inputs(model, sample, group=3, gen=gen, extra_fields=extra_fields, history=history)
        _export(StepGraph(decoder, history, extra_type, extra_fields).eval(), tuple(example.values()),
                tmp / "decoder_step.onnx", step_in, step_out, axes)
        report: dict[str, float] = {}
        _check(model, tmp, sample, images, history, extra_type, extra_fields, step_out, gen, report)
        _write_metadata(model, tmp, grid, C, history, extra_specs, step_out, source, report)
        for name, path in (extra_files or {}).items():
            shutil.copyfile(path, tmp / name)
        out.mkdir(parents=True, exist_ok=True)
        (out / "runtime.json").unlink(missing_ok=True)  # first: a folder without it is not an exported model
        for name in OPTIONAL_FILES:  # an earlier export's file this model has no counterpart of
            if not (tmp / name).exists():
                (out / name).unlink(missing_ok=True)
        for path in tmp.iterdir():  # the checked files, then runtime.json last: its presence marks a whole folder
            if path.name != "runtime.json":
                shutil.move(path, out / path.name)
        shutil.move(tmp / "runtime.json", out / "runtime.json")
    return report


def _step_inputs(model: Captioner, annotations: torch.Tensor, group: int, gen: torch.Generator,
                 extra_fields: list[str], history: bool, steps: int = 0) -> dict[str, torch.Tensor]:
    """Step inputs for ``annotations`` (n images) with ``group`` rows each, from ``steps`` teacher-forced words
    of random ids (so that the row state is not all zeros)."""
    decoder = model.decoder
    with torch.no_grad():
        state = decoder.init_state(annotations, decoding=True)
        rows = torch.arange(annotations.shape[0]).repeat_interleave(group)  # (B,)
        state = state.index(rows)  # one row per beam, group 1 while stepping here
        V = model.cfg.vocab_size
        for _ in range(steps):
            words = torch.randint(4, V, (rows.shape[0],), generator=gen)
            _, state, _, _ = decoder.step(words, state)
        words = torch.randint(4, V, (rows.shape[0],), generator=gen)
        per_image = decoder.init_state(annotations, decoding=True)
    inputs = {"words": words, "h": state.h, "c": state.c, "annotations_in": per_image.annotations,
              "keys": per_image.keys, "values": per_image.values}
    if history:
        inputs["history"] = state.history
    for f in extra_fields:
        inputs[f] = getattr(state.extra, f)
    return inputs


def _check(model, folder, sample, images, history, extra_type, extra_fields, step_out, gen, report) -> None:
    """Every graph against PyTorch: the encoder on 2 images, init on them, the step at several batch, group and
    step counts (the trace must not have fixed a shape)."""
    with torch.no_grad():
        _compare("encoder", {"annotations": _session(folder / "encoder.onnx").run(None, {"images": images.numpy()})[0]},
                 {"annotations": sample}, report)
        init = _session(folder / "decoder_init.onnx")
        names = [o.name for o in init.get_outputs()]
        for n in (1, 2):
            state = model.decoder.init_state(sample[:n], decoding=True)
            got = dict(zip(names, init.run(None, {"annotations": sample[:n].numpy()})))
            _compare("decoder_init", got, {"h": state.h, "c": state.c, "annotations_in": state.annotations,
                                           "keys": state.keys, "values": state.values}, report)
        step = _session(folder / "decoder_step.onnx")
        feed_names = {i.name for i in step.get_inputs()}
        graph = StepGraph(model.decoder, history, extra_type, extra_fields)
        for n, group, steps in ((1, 1, 0), (2, 3, 4), (2, 1, 9), (1, 5, 2)):
            inputs = _step_inputs(model, sample[:n], group, gen, extra_fields, history, steps)
            expected = dict(zip(step_out, graph(*inputs.values())))
            got = dict(zip([o.name for o in step.get_outputs()],
                           step.run(None, {k: v.numpy() for k, v in inputs.items() if k in feed_names})))
            _compare("decoder_step", got, expected, report)


def _write_metadata(model, folder, grid, channels, history, extra_specs, step_out, source, report) -> None:
    cfg, vocab = model.cfg, model.vocab
    (folder / "vocab.json").write_text(vocab.to_json())
    domain = None
    if model.domain is not None:
        d = model.domain
        np.savez(folder / "domain.npz", mean=d.mean.float().numpy(), precision=d.precision.float().numpy())
        domain = {"file": "domain.npz", "threshold": d.threshold, "feature": d.feature, "percentile": d.percentile,
                  "dataset": d.dataset, "info": d.info}
    meta = {
        "format": FORMAT, "version": VERSION, "source": source,
        "model": cfg.to_dict(), "preprocessing": model.preprocessing.to_dict(),
        "decoding": model.decoding.to_dict(), "grid": list(grid), "encoder_channels": channels,
        "vocab": "vocab.json", "domain": domain,
        "step": {"history": history, "extension_state": extra_specs, "outputs": step_out,
                 "gate": model.decoder.f_beta is not None},
        # plug-in decoding settings that the decoder extension reads are baked into the step graph: fixed
        "fixed_decoding": {k: model.decoding.plugin_settings[k] for k in extension_settings(model)},
        "check": {"tolerance": TOLERANCE, "max_abs_diff": report},
    }
    (folder / "runtime.json").write_text(json.dumps(meta, indent=2))
