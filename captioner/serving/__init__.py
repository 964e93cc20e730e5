"""Pure helpers for serving captions (the Gradio app uses them; nothing here imports gradio), one concern a module:

- ``checkpoints``: which checkpoint folders are offered under which short names (never server paths), the
  ``ModelCache`` (each checkpoint loaded once, shared by every request), ``scrub_paths`` for messages users see.
- ``inputs``: the beam-size and upload-size checks, and the picture decoded with the bomb guard.
- ``overlays``: the ``OverlayStore`` (overlays written atomically under a content-hash name, pruned to bounds).
- ``explain``: ``explain_batch``: images through the model (PyTorch, or an exported folder on ONNX Runtime) as one
  batch, with per-word statistics and whether each is like the training images (``domain_of``,
  ``out_of_domain_notice``); ``explain`` / ``caption_with_overlays`` for one image; ``gallery``: the per-word overlay files rendered from an explanation's maps.
- ``batcher``: ``Batcher``, the bounded queue in front of the model that runs concurrent requests as one batch.
- ``middleware``: ``BodySizeLimit`` and ``UploadQuota``, ASGI limits on what requests may bring.
- ``opaque_files``: ``OpaqueFiles``, ASGI middleware that hands files out as ``files/<id>/<name>``, never a server path.
"""

from captioner.errors import CheckpointError
from captioner.serving.checkpoints import (ModelCache, attention_kind, default_checkpoints_dir, example_images,
                                          find_checkpoints, scrub_paths, short_names, soft_first)
from captioner.serving.batcher import Batcher, Busy
from captioner.serving.explain import (CaptionOutput, Explanation, caption_with_overlays, domain_of, explain,
                                      explain_batch, gallery, highlight, out_of_domain_notice, prepare, smoke_test)
from captioner.serving.inputs import (MAX_BEAM_SIZE, MAX_UPLOAD_BYTES, check_beam_size, check_upload_size,
                                     data_url_bytes, load_picture)
from captioner.serving.middleware import BodySizeLimit, Health, ServerState, UploadQuota, folder_bytes
from captioner.serving.opaque_files import FileRegistry, OpaqueFiles
from captioner.serving.overlays import OVERLAY_MAX_AGE_S, OVERLAY_MAX_BYTES, OVERLAY_MAX_FILES, OverlayStore

__all__ = ["Batcher", "Busy", "explain_batch", "gallery", "prepare", "Health", "ServerState", "FileRegistry", "OpaqueFiles", "UploadQuota", "folder_bytes", "find_checkpoints", "default_checkpoints_dir", "short_names", "soft_first",
           "attention_kind", "example_images", "scrub_paths", "ModelCache", "OverlayStore", "CaptionOutput",
           "Explanation", "caption_with_overlays", "domain_of", "out_of_domain_notice", "explain", "smoke_test",
           "highlight", "check_beam_size",
           "check_upload_size", "data_url_bytes", "load_picture", "BodySizeLimit", "CheckpointError", "MAX_BEAM_SIZE",
           "MAX_UPLOAD_BYTES", "OVERLAY_MAX_AGE_S", "OVERLAY_MAX_BYTES", "OVERLAY_MAX_FILES"]
