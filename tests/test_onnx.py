"""The ONNX Runtime route: ``captioner-export onnx`` and ``captioner.runtime`` give the PyTorch route's captions,
attention, probabilities and domain verdicts, and the runtime runs with torch made unimportable."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from captioner.model.config import ModelConfig  # noqa: E402
from captioner.decoding.config import DecodingConfig  # noqa: E402
from captioner.model.domain import fit_domain, pool_features  # noqa: E402
from captioner.encoders import Preprocessing  # noqa: E402
from captioner.model.captioner import Captioner  # noqa: E402
from captioner.checkpoints.onnx_export import ExportError, export  # noqa: E402
from captioner.runtime import load_onnx  # noqa: E402
from captioner.scenes.phrase_order import PLACEHOLDER  # noqa: E402
from captioner.vocab import Vocabulary  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VOCAB = Vocabulary([PLACEHOLDER, "a", "two", "small", "large", "red", "blue", "circle", "square", "and", "picture",
                    "of"])
SIZE, GRID = 64, 4  # small_cnn halves 4 times: a 4x4 grid
# every device the shipped models use: location-aware scaled-dot attention with the word in the query, positional
# channels, the gate, the scenes plug-in's look-alike channels, count head and mask, number-last order with
# inhibition of return, the repeat penalty and the phrase merge
SCENES = dict(plugin="scenes", plugin_config={"lookalike": 2, "count_head": True, "count_mask": True,
                                              "number_last": True, "singular_nouns": True})
DECODING = DecodingConfig(beam_size=3, max_len=8, length_penalty=1.5,
                          plugin_settings={"inhibit_named": 5.0, "repeat_penalty": 2.0, "merge_repeats": True})


# The start of a script run with ``python -c``: importing torch fails as it does where torch is not installed;
# ``assert_no_torch()`` at its end checks that nothing imported it.
BLOCK_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):  # as Python says it where torch is not installed
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTorch())
def assert_no_torch():
    assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch was imported"
"""


def tiny(**overrides) -> Captioner:
    torch.manual_seed(0)
    cfg = ModelConfig(**{**dict(encoder="small_cnn", encoder_weights=None, grid=GRID, hidden_dim=24, embed_dim=12,
                                attention_dim=12, dropout=0.0, location=True, word_query=True, score="scaled_dot",
                                positional=4, **SCENES), **overrides})
    model = Captioner(cfg, VOCAB, Preprocessing(SIZE, (0.5,) * 3, (0.5,) * 3), encoder_weights=None,
                      decoding=DECODING if cfg.plugin else DecodingConfig(max_len=8)).eval()
    with torch.no_grad():  # sharper word scores than the random init's: captions that are not near-ties
        model.decoder.L_o.weight.mul_(8.0)
    return model


def pictures(n: int, seed: int = 0) -> list[Image.Image]:
    """Noise at the encoder's input size: Pillow's resize (the runtime's) and torchvision's (PyTorch's) may differ
    by one grey level, which on noise moves the features more than on any photo."""
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)) for i in range(n)]


@pytest.fixture(scope="module")
def model() -> Captioner:
    m = tiny()
    with torch.no_grad():  # a domain check fitted on these pictures' features, as training attaches one
        feats = pool_features(m.encode(torch.stack([m.transform(p) for p in pictures(12, seed=5)])))
    m.domain = fit_domain(feats, feats[:6], dataset="noise")
    return m


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "tiny"
    report = export(model, out, source="tiny")
    assert report and max(report.values()) <= 1e-4
    return out


@pytest.mark.parametrize("beam_size", [1, 3])
def test_the_runtime_captions_as_pytorch(model, exported, beam_size):
    runtime = load_onnx(exported, threads=1)
    images = pictures(7)
    ours, theirs = runtime.caption(images, beam_size=beam_size), model.caption(images, beam_size=beam_size)
    assert any(len(r.tokens) > 2 for r in theirs)  # the captions say something
    for a, b in zip(ours, theirs):
        assert a.tokens == b.tokens
        assert a.alphas.shape == b.alphas.shape and np.abs(a.alphas - b.alphas).max() < 1e-4
        assert a.log_prob == pytest.approx(b.log_prob, abs=1e-3)
        assert a.in_domain == b.in_domain and a.domain_score == pytest.approx(b.domain_score, rel=1e-4)


def test_the_explorer_values_match(model, exported):
    from captioner.serving.explain import explain

    runtime = load_onnx(exported, threads=1)
    picture = pictures(1, seed=3)[0]
    theirs, _ = explain(model, picture, 3)
    ours = runtime.explain(picture, 3)
    assert ours["tokens"] == theirs.tokens
    assert np.allclose(ours["word_probs"], theirs.word_probs, atol=1e-4)
    assert np.allclose(ours["betas"], theirs.betas, atol=1e-5)
    assert np.allclose(ours["entropies"], theirs.entropies, atol=1e-4)
    assert [h["text"] for h in ours["nbest"]] == [h["text"] for h in theirs.nbest]


def test_measured_beams_record_what_the_teacher_forced_pass_gives(exported):
    from captioner.runtime.explain import teacher_forced

    runtime = load_onnx(exported, threads=1)
    annotations = runtime.encode(np.stack([runtime.transform(p) for p in pictures(4, seed=5)]))  # (4, L, C)
    plain = runtime.decode(annotations, 3, n_best=None)
    measured = runtime.decode(annotations, 3, n_best=None, measure=True)
    assert [[(h.words, h.log_prob) for h in hyps] for hyps in plain] == \
        [[(h.words, h.log_prob) for h in hyps] for hyps in measured]
    for b, hyps in enumerate(measured):
        for h in hyps:
            (probs, betas, entropies), = teacher_forced(runtime, annotations[b:b + 1], [h.words])
            assert np.allclose(h.measures, np.stack([probs, betas, entropies], 1), atol=1e-5)


def test_decoding_settings_change_on_the_runtime_except_the_baked_ones(model, exported):
    from captioner.errors import ConfigError

    runtime = load_onnx(exported, threads=1)
    runtime.set_decoding(repeat_penalty=0.0, merge_repeats=False, length_penalty=0.0)
    assert runtime.decoding["plugin_settings"]["repeat_penalty"] == 0.0
    with pytest.raises(ConfigError, match="inhibit_named.*fixed"):
        runtime.set_decoding(inhibit_named=1.0)
    assert json.loads((exported / "runtime.json").read_text())["fixed_decoding"] == {"inhibit_named": 5.0}


def test_the_runtime_needs_no_torch(model, exported, tmp_path):
    """A subprocess in which importing torch fails captions the exported folder; nothing imports torch."""
    images = pictures(3, seed=7)
    paths = []
    for i, im in enumerate(images):
        paths.append(tmp_path / f"p{i}.png")
        im.save(paths[-1])
    script = BLOCK_TORCH + f"""
import json
import captioner
from captioner.runtime import load_onnx
model = captioner.load_onnx({str(exported)!r}, threads=1)
results = model.caption({[str(p) for p in paths]!r})
from captioner.commands.caption import cli  # caption.py --runtime onnx, to a file
assert cli({[str(p) for p in paths]!r} + ["--runtime", "onnx", "--checkpoint", {str(exported)!r}, "--quiet",
            "--output", {str(tmp_path / "out.jsonl")!r}]) == 0
assert_no_torch()
print(json.dumps([[r.text, r.alphas.tolist(), r.in_domain] for r in results]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    expected = model.caption(paths)
    assert [g[0] for g in got] == [r.text for r in expected]
    assert all(np.abs(np.array(g[1]) - r.alphas).max() < 1e-4 for g, r in zip(got, expected) if len(r.alphas))
    assert [g[2] for g in got] == [r.in_domain for r in expected]
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert [json.loads(line)["caption"] for line in lines] == [r.text for r in expected]


def test_caption_py_runtime_onnx_writes_the_same_records(model, exported, tmp_path, capsys):
    from captioner.commands.caption import cli

    for i, im in enumerate(pictures(3, seed=9)):
        im.save(tmp_path / f"p{i}.png")
    (tmp_path / "bad.png").write_bytes(b"not an image")
    assert cli([str(tmp_path), "--runtime", "onnx", "--checkpoint", str(exported), "--quiet",
                "--output", str(tmp_path / "out.jsonl")]) == 1  # 1: one file could not be read, and is recorded
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r.get("error") is not None for r in records] == [True, False, False, False]
    expected = model.caption(sorted(tmp_path.glob("p*.png")))
    assert [r["caption"] for r in records[1:]] == [e.text for e in expected]
    assert cli([str(tmp_path / "p0.png"), "--runtime", "onnx", "--quiet"]) == 2  # a checkpoint, not an export
    assert "captioner-export onnx" in capsys.readouterr().err


def test_export_refuses_beyond_the_tolerance_and_writes_nothing(monkeypatch, tmp_path):
    import captioner.checkpoints.onnx_export as onnx_export

    monkeypatch.setattr(onnx_export, "TOLERANCE", -1.0)  # any difference, even none, is too large
    with pytest.raises(ExportError, match="differs from PyTorch"):
        export(tiny(plugin=None, plugin_config={}), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("options", [
    dict(score="additive", attention="hard", hard_inference="argmax", value_projection=True),
    dict(score="cosine", location=False, word_query=False, channel_attention=True, self_attention=True, positional=0),
], ids=["additive+hard-argmax+values", "cosine+channel+self-attention"])
def test_other_architecture_options_export_and_caption_alike(options, tmp_path):
    model = tiny(plugin=None, plugin_config={}, **options)
    export(model, tmp_path / "out")
    images = pictures(4, seed=11)
    ours, theirs = load_onnx(tmp_path / "out", threads=1).caption(images), model.caption(images)
    assert [r.tokens for r in ours] == [r.tokens for r in theirs]


def test_an_option_that_cannot_export_is_named(tmp_path):
    with pytest.raises(ExportError, match="attention none"):
        export(tiny(plugin=None, plugin_config={}, attention="none", location=False), tmp_path / "out")


@pytest.mark.integration
@pytest.mark.parametrize("name", ["shapes-soft", "shapes-hard"])
def test_a_shipped_checkpoint_exports_and_captions_alike(name, tmp_path):
    import captioner
    from captioner.commands.export import cli

    assert cli(["onnx", str(REPO / "checkpoints" / name), str(tmp_path / name)]) == 0
    from captioner.scenes.shapes import generate

    generate(tmp_path / "scenes", seed=3, splits={"test": 8}, workers=1, progress=False)
    paths = sorted((tmp_path / "scenes" / "images").glob("*"))
    ours = captioner.load_onnx(tmp_path / name, threads=1).caption(paths)
    theirs = captioner.load(REPO / "checkpoints" / name).caption(paths)
    assert [r.text for r in ours] == [r.text for r in theirs]
    assert [r.in_domain for r in ours] == [r.in_domain for r in theirs]
