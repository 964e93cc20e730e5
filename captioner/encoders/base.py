"""The Encoder module every backbone is built as: a CNN cut into stages whose last map (optionally with earlier
stages pooled onto it) is flattened into the paper's annotation vectors (B, L, C), and which knows its grid."""

from __future__ import annotations

import torch
from torch import nn

from captioner.allocator import keep_freed_memory

# How the encoder runs its convolutions (bench/encoder_backends.py measures them, docs/benchmarks.md):
# "eager": NCHW, one image at a time on CPU; "channels_last": NHWC weights and inputs, which oneDNN runs without
# reordering every depthwise convolution, 4 images at a time; "compile": channels_last through
# torch.compile (a C++ compiler at the first call of each input shape, tens of seconds). Same weights; results
# within 1e-3 of eager (1e-4 for channels_last).
ENCODER_BACKENDS = ("eager", "channels_last", "compile")
DEFAULT_BACKEND = "channels_last"
# images per encoder call on CPU (0: the whole batch). At load 2.4 (bench/encoder_backends.py, batch 32, 2 threads)
# NHWC ran 113.9 images/s in chunks of 8, 111.1 one at a time and 48.4 as the whole batch (activations outgrow the
# caches), eager one at a time 91.6; an earlier reading at load 8 that favoured the whole batch was noise.
# channels_last now takes 4: the largest activation of efficientnet_lite0 at 224 px (96 x 112 x 112 floats, 4.8 MB
# an image) is 38.5 MB for 8 images, above glibc's mmap ceiling (allocator.MMAP_THRESHOLD, 32 MiB), so every such
# block was mmapped and page-faulted in afresh: 37,636 faults per call of 32 images. With 4 there are none, and the
# encoder ran at 141.7 instead of 120.8 images/s (bench/encoder_backends.py in docs/benchmarks.md). The chunks are
# for CHUNK_IMAGE_SIDE px; larger inputs get proportionally fewer images per call (at least one).
# compile keeps small fixed shapes (one compilation per shape); its 8 was not re-measured.
CPU_CHUNKS = {"eager": 1, "channels_last": 4, "compile": 8}
CHUNK_IMAGE_SIDE = 224


class Encoder(nn.Module):
    """A CNN cut into stages; ``forward`` returns annotations (B, L, C).

    ``taps``: indices of earlier stages whose outputs are average-pooled to the last stage's grid and concatenated
    with it (a hypercolumn: early stages keep colour and edges that late ImageNet features blur).
    """

    def __init__(self, stages: list[nn.Module], channels: int, grid: int | None = None, taps: tuple[int, ...] = (),
                 halvings: tuple[str, ...] = ()):
        """``halvings``: "ceil" (a padded stride-2 conv) or "floor" (a 2x2 max-pool) for each stride-2 step of the
        stages; with them the grid is known from the image size alone (``grid_size``)."""
        super().__init__()
        self.grid, self.halvings = grid, tuple(halvings)
        self.stages = nn.ModuleList(stages)
        self.channels = channels
        self.taps = tuple(taps)
        # Torchvision backbones give a 7x7 map at 224 px; the paper's 14x14 comes from adaptive pooling there.
        self.pool = nn.AdaptiveAvgPool2d(grid) if grid else nn.Identity()
        self.trainable_from: int | None = None
        self.freeze()  # also puts the frozen stages' BatchNorm in eval mode
        self.backend = "eager"
        self.set_backend(DEFAULT_BACKEND)

    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        x = images  # (B, 3, H, W)
        tapped = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i in self.taps:
                tapped.append(x)
        x = self.pool(x)  # (B, C_last, h, w)
        if tapped:
            x = torch.cat([nn.functional.adaptive_avg_pool2d(t, x.shape[-2:]) for t in tapped] + [x], 1)  # (B, C, h, w)
        return x

    # In NCHW on CPU a batch of 32 runs the convolutions about 3x slower per image than one image at a time: the
    # early stages' activations (B x 16 x 112 x 112 floats) outgrow the caches (bench/speed.py, docs/benchmarks.md).
    # channels_last does not suffer from it the same way: ``set_backend`` picks the chunk with the backend.
    cpu_chunk = 1

    def set_backend(self, backend: str) -> "Encoder":
        """Run the convolutions as ``backend`` (one of ENCODER_BACKENDS); the weights' values do not change, so
        a state dict, a checkpoint or a feature cache is the same under either."""
        if backend not in ENCODER_BACKENDS:
            raise ValueError(f"unknown encoder backend {backend!r}; choose one of {', '.join(ENCODER_BACKENDS)}")
        layout = torch.contiguous_format if backend == "eager" else torch.channels_last
        self.stages.to(memory_format=layout)  # 4-d weights only; in place, parameters stay the same objects
        self.backend, self.cpu_chunk = backend, CPU_CHUNKS[backend]
        self._compiled = None  # the torch.compile'd feature_map, made at the first inference call
        return self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, L, C). On CPU, with every BatchNorm in eval mode (so each image's result does not
        depend on its batch), the batch is encoded ``cpu_chunk`` images at a time (fewer for inputs larger than
        CHUNK_IMAGE_SIDE). On CPU it also sets glibc's malloc, for the whole process, to keep freed memory
        (``keep_freed_memory``): each chunk allocates the same activations again."""
        if images.device.type == "cpu":
            keep_freed_memory()
            per_image = self.trainable_from is None or not self.training
            n = self.cpu_chunk
            if n:
                n = max(1, min(n, n * CHUNK_IMAGE_SIDE ** 2 // (images.shape[-2] * images.shape[-1])))
            if per_image and n and images.shape[0] > n:
                return torch.cat([self.forward_all(chunk) for chunk in images.split(n)])  # (B, L, C)
        return self.forward_all(images)

    def forward_all(self, images: torch.Tensor) -> torch.Tensor:
        if self.backend != "eager":
            images = images.contiguous(memory_format=torch.channels_last)  # (B, 3, H, W), stored (B, H, W, 3)
        if self.backend == "compile" and not torch.is_grad_enabled():  # inference only: training stays eager
            if self._compiled is None:
                self._compiled = torch.compile(self.feature_map, dynamic=False)
            return self._compiled(images).flatten(2).transpose(1, 2)  # (B, L, C)
        return self.feature_map(images).flatten(2).transpose(1, 2)  # (B, L, C)

    def __getstate__(self) -> dict:
        """Copies and pickles leave the compiled function behind (it is bound to this encoder)."""
        return {**self.__dict__, "_compiled": None}

    def grid_size(self, image_size: int) -> tuple[int, int]:
        """(h, w) of the annotation grid for square ``image_size`` px inputs, from the architecture (no forward
        pass) when it is known: adaptive pooling fixes it, else each stride-2 step halves the side."""
        if self.grid:
            return self.grid, self.grid
        if self.halvings:
            side = image_size
            for rounding in self.halvings:
                side = -(-side // 2) if rounding == "ceil" else side // 2
            return side, side
        with torch.no_grad():  # an encoder built elsewhere without its halvings: measure once
            training = self.training
            self.eval()
            x = self.feature_map(torch.zeros(1, 3, image_size, image_size))
            self.train(training)
        return int(x.shape[-2]), int(x.shape[-1])

    def freeze(self) -> None:
        self.fine_tune(None)

    def fine_tune(self, from_stage: int | None) -> None:
        """Train stages ``from_stage`` onwards (None: everything frozen, and BatchNorm kept in eval mode)."""
        self.trainable_from = from_stage
        for i, stage in enumerate(self.stages):
            stage.requires_grad_(from_stage is not None and i >= from_stage)
        self.train(self.training)

    def train(self, mode: bool = True) -> "Encoder":
        super().train(mode)
        # Frozen stages keep their BatchNorm statistics.
        for i, stage in enumerate(self.stages):
            if self.trainable_from is None or i < self.trainable_from:
                stage.eval()
        return self
