"""The decoder protocol's onnx impl (bench.decoder_protocol): the exported protocol decoder, searched by
captioner.runtime on numpy, writes the same words as our PyTorch beam search for every protocol image."""

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from bench.decoder_protocol import IMAGES, STEPS, export_onnx, make_onnx_pass  # noqa: E402


@pytest.mark.parametrize("phase", ["beam_single", "beam_batched"])
def test_the_onnx_impl_writes_our_words(phase, tmp_path_factory):
    folder = tmp_path_factory.getbasetemp() / "protocol-onnx"
    if not folder.exists():
        report = export_onnx(folder)
        assert max(report.values()) <= 1e-4
    one_pass, items, rows, params, check = make_onnx_pass(phase, str(folder), threads=1)
    one_pass()
    assert items == IMAGES and params > 3_000_000
    assert check().startswith(f"words per caption [{STEPS}], same words as ours (PyTorch, one image at a time) for "
                              f"{IMAGES}/{IMAGES} images")
