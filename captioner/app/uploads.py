"""The app's image upload box: Gradio's upload handed over as a file path, undecoded, so that decoding happens
once, in captioner.images.open_image; an inline data: URL is size-checked before it is decoded, and saved as bytes."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import gradio as gr

from captioner.serving import MAX_UPLOAD_BYTES, data_url_bytes


def save_data_url(url: str, folder: Path) -> str:
    """An inline image's bytes, undecoded, in the (pruned) overlay store: open_image decodes it like any upload."""
    import base64
    import binascii
    import hashlib

    header, _, payload = url.partition(",")
    try:
        data = base64.b64decode(payload, validate=True) if header.endswith(";base64") else payload.encode()
    except (binascii.Error, ValueError):
        raise gr.Error("the data: URL is not valid base64.", print_exception=False) from None
    path = folder / f"upload-{hashlib.sha256(data).hexdigest()[:32]}.bin"
    if not path.is_file():
        # a temporary name of its own: clients sending the same image at once must not share (and lose) one
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".upload.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return str(path)


def image_input(upload_folder: Callable[[], Path]) -> gr.Image:
    """An upload box that hands the function the uploaded file's path untouched: decoding happens once, in
    captioner.images.open_image, with its size, pixel, side and aspect limits. An inline data: URL (which the
    20 MB limit of /upload does not see) is refused over the size limit before it is decoded, else saved as bytes
    and decoded by open_image too. ``upload_folder()`` names the folder at the time of the upload."""
    component = gr.Image(type="filepath", image_mode=None, label="Image", sources=["upload", "clipboard"],
                         height=320, elem_id="image-input")

    def preprocess(payload):
        if payload is None:
            return None
        url = getattr(payload, "url", None) or ""
        if url.startswith("data:"):
            if data_url_bytes(url) > MAX_UPLOAD_BYTES:
                raise gr.Error(f"the image is over the upload limit of {MAX_UPLOAD_BYTES // 2**20} MB.",
                               print_exception=False)
            return save_data_url(url, upload_folder())
        path = getattr(payload, "path", None)
        if path is None:
            raise gr.Error("no image given; upload an image or pick an example.", print_exception=False)
        return path  # already checked by Gradio to lie in its upload folder

    component.preprocess = preprocess  # instance attribute: Gradio calls block.preprocess()
    return component
