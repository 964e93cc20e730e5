"""Feature cache for frozen encoders: annotations computed once per dataset split, stored as float16 memory-mapped
``.npy`` shards with a fingerprint of encoder + weights + preprocessing + image list, so a stale cache is never used.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from captioner.data.karpathy import ImageDataset, ImageFileLoader, KarpathySplit, collate_images

SHARD_SIZE = 2048  # images per shard file


def weights_digest(encoder: torch.nn.Module) -> str:
    """A hash of the encoder's parameters and buffers: catches random inits, changed weight files, fine-tuning."""
    h = hashlib.sha256()
    for name, tensor in sorted(encoder.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(tensor.shape)).encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def fingerprint(model, image_paths: list[Path]) -> str:
    """Changes whenever the encoder, its weights (by content), the grid, the preprocessing or the image list
    (paths, order, sizes, modification times) change."""
    h = hashlib.sha256()
    cfg = model.cfg
    meta = {"encoder": cfg.encoder, "weights": cfg.encoder_weights, "grid": cfg.grid,
            "preprocessing": model.preprocessing.to_dict(), "weights_digest": weights_digest(model.encoder),
            "images": len(image_paths)}
    h.update(json.dumps(meta, sort_keys=True).encode())
    for p in image_paths:
        st = p.stat()
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


class FeatureCache:
    """index -> annotations (L, C) float32, read from float16 shards."""

    def __init__(self, folder: Path, meta: dict, reused: bool = False):
        self.folder, self.meta, self.reused = folder, meta, reused
        self.shards = [np.load(folder / name, mmap_mode="r") for name in meta["shards"]]

    def __len__(self) -> int:
        return self.meta["count"]

    def __call__(self, index: int) -> torch.Tensor:
        shard, row = divmod(index, SHARD_SIZE)
        # a float16 copy, widened by torch: 5x faster than numpy's float16 -> float32 conversion (18 against
        # 98 us per 196 x 232 row), which was a twentieth of a cached training step
        return torch.from_numpy(np.array(self.shards[shard][row])).float()

    @property
    def bytes_per_image(self) -> int:
        L, C = self.meta["shape"]
        return L * C * 2  # float16

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_image * len(self)

    def describe(self) -> str:
        """One line: where, how many images, bytes per image, total, and whether it was reused or built."""
        L, C = self.meta["shape"]
        return (f"feature cache {self.folder} ({'reused' if self.reused else 'built'}): {len(self)} images x "
                f"{L}x{C} float16 = {self.bytes_per_image:,} bytes/image, {self.total_bytes / 2**20:.1f} MiB")

    @staticmethod
    def _complete(folder: Path, meta: dict, fp: str) -> bool:
        """Current fingerprint, every shard present with the rows and shape the meta promises."""
        if meta.get("fingerprint") != fp:
            return False
        rows = 0
        for name in meta.get("shards", []):
            try:
                shard = np.load(folder / name, mmap_mode="r")
            except (OSError, ValueError):
                return False
            if list(shard.shape[1:]) != list(meta["shape"]):
                return False
            rows += shard.shape[0]
        return rows == meta.get("count")

    @classmethod
    def open_or_build(cls, model, split: KarpathySplit, root: str | Path, batch_size: int = 32, workers: int = 0,
                      progress: bool = True) -> "FeatureCache":
        """Reuse ``root/<dataset>-<split>-<fingerprint>/`` when complete and current; else build it."""
        paths = split.image_paths
        fp = fingerprint(model, paths)
        folder = Path(root) / f"{split.json_path.stem}-{split.split}-{model.cfg.encoder}-{fp[:16]}"
        folder.parent.mkdir(parents=True, exist_ok=True)
        # One builder at a time per cache folder: a second process (another run, another rank) waits, then reuses.
        with open(folder.parent / f"{folder.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return cls._open_or_build_locked(model, split, folder, paths, fp, batch_size, workers, progress)

    @classmethod
    def _open_or_build_locked(cls, model, split, folder: Path, paths, fp: str, batch_size: int, workers: int,
                              progress: bool) -> "FeatureCache":
        meta_path = folder / "meta.json"
        if meta_path.is_file():
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                meta = {}
            if cls._complete(folder, meta, fp):
                return cls(folder, meta, reused=True)
            meta_path.unlink()  # stale or damaged: rebuilt below
        folder.mkdir(parents=True, exist_ok=True)
        try:
            meta = cls._build(model, split, folder, paths, batch_size, workers, progress)
        except BaseException:  # an unreadable image, any error, Ctrl-C: no partial shard stays behind
            cls._remove_partial(folder)
            raise
        meta["fingerprint"] = fp
        meta["bytes_per_image"] = int(np.prod(meta["shape"])) * 2
        tmp = meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, meta_path)  # written last: its presence means every shard is complete
        return cls(folder, meta)

    @staticmethod
    def _remove_partial(folder: Path) -> None:
        """Delete a build that did not finish: its shards (whole or ``.tmp``) are of no use without meta.json, and
        the folder is this fingerprint's alone (the caller holds its lock)."""
        shutil.rmtree(folder, ignore_errors=True)

    @staticmethod
    @torch.inference_mode()
    def _build(model, split, folder: Path, paths, batch_size, workers, progress) -> dict:
        encoder = model.encoder.eval()
        device = next(encoder.parameters()).device
        loader = DataLoader(ImageDataset(split, ImageFileLoader(paths, model.preprocessing.transform())),
                            batch_size=batch_size, num_workers=workers, collate_fn=collate_images)
        if progress:
            from tqdm import tqdm

            loader = tqdm(loader, desc=f"caching {split.split} features", unit="batch")
        shards: list[str] = []
        current, filled, shape = None, 0, None
        for batch in loader:
            feats = encoder(batch["inputs"].to(device)).half().cpu().numpy()  # (B, L, C)
            for f in feats:
                if current is None:
                    shape = f.shape
                    n = min(SHARD_SIZE, len(paths) - len(shards) * SHARD_SIZE)
                    name = f"shard{len(shards):04d}.npy"
                    current = np.lib.format.open_memmap(folder / (name + ".tmp"), mode="w+", dtype=np.float16,
                                                        shape=(n, *shape))
                    filled = 0
                current[filled] = f
                filled += 1
                if filled == current.shape[0]:
                    current.flush()
                    del current
                    current = None
                    os.replace(folder / (f"shard{len(shards):04d}.npy.tmp"), folder / f"shard{len(shards):04d}.npy")
                    shards.append(f"shard{len(shards):04d}.npy")
        return {"count": len(paths), "shape": list(shape), "shards": shards, "dtype": "float16",
                "images": [str(p) for p in paths[:3]]}
