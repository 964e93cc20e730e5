"""Feature cache for frozen encoders: annotations computed once per dataset split, stored as float16 memory-mapped
``.npy`` shards with a fingerprint of encoder + weights + preprocessing + image list, so a stale cache is never used.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from captioner.data.karpathy import ImageDataset, ImageFileLoader, KarpathySplit, collate_images

SHARD_SIZE = 2048  # images per shard file


def fingerprint(model, image_paths: list[Path]) -> str:
    """Changes whenever the encoder, its weights source, the grid, the preprocessing or the image list change."""
    h = hashlib.sha256()
    cfg = model.cfg
    meta = {"encoder": cfg.encoder, "weights": cfg.encoder_weights, "grid": cfg.grid,
            "preprocessing": model.preprocessing.to_dict()}
    h.update(json.dumps(meta, sort_keys=True).encode())
    for p in image_paths:
        st = p.stat()
        h.update(f"{p}\0{st.st_size}\0{int(st.st_mtime)}\n".encode())
    return h.hexdigest()


class FeatureCache:
    """index -> annotations (L, C) float32, read from float16 shards."""

    def __init__(self, folder: Path, meta: dict):
        self.folder, self.meta = folder, meta
        self.shards = [np.load(folder / name, mmap_mode="r") for name in meta["shards"]]

    def __len__(self) -> int:
        return self.meta["count"]

    def __call__(self, index: int) -> torch.Tensor:
        shard, row = divmod(index, SHARD_SIZE)
        return torch.from_numpy(np.array(self.shards[shard][row], dtype=np.float32))

    @property
    def bytes_per_image(self) -> int:
        L, C = self.meta["shape"]
        return L * C * 2

    @classmethod
    def open_or_build(cls, model, split: KarpathySplit, root: str | Path, batch_size: int = 32, workers: int = 0,
                      progress: bool = True) -> "FeatureCache":
        """Reuse ``root/<dataset>-<split>-<fingerprint>/`` when complete and current; else build it."""
        paths = split.image_paths
        fp = fingerprint(model, paths)
        folder = Path(root) / f"{split.json_path.stem}-{split.split}-{model.cfg.encoder}-{fp[:16]}"
        meta_path = folder / "meta.json"
        if meta_path.is_file():
            meta = json.loads(meta_path.read_text())
            if meta.get("fingerprint") == fp and all((folder / s).is_file() for s in meta["shards"]):
                return cls(folder, meta)
        folder.mkdir(parents=True, exist_ok=True)
        meta = cls._build(model, split, folder, paths, batch_size, workers, progress)
        meta["fingerprint"] = fp
        tmp = meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, meta_path)  # written last: its presence means every shard is complete
        return cls(folder, meta)

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
