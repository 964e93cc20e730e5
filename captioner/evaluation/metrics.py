"""Caption metrics: the COCO scorers (called one by one), NLTK BLEU as a cross-check, attention maps on the image
(``upsample_attention``, ``box_mask``) and their entropy. The synthetic scenes' object F1 and attention correctness
are ``captioner.scenes.metrics``."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np



def coco_scores(references: Sequence[Sequence[str]], candidates: Sequence[str], meteor: bool = True,
                spice: bool = False) -> dict[str, float]:
    """BLEU-1..4, METEOR, ROUGE-L, CIDEr-D for already-tokenised, lower-case, space-joined captions.

    ``references[i]`` are the reference sentences of image i, ``candidates[i]`` its generated caption.
    """
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    gts = {i: list(refs) for i, refs in enumerate(references)}
    res = {i: [c if c.strip() else "<empty>"] for i, c in enumerate(candidates)}
    out: dict[str, float] = {}
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    out.update({f"BLEU-{n + 1}": float(b) for n, b in enumerate(bleu)})
    if meteor and not java_available():
        warnings.warn("METEOR skipped: it needs Java (`java` was not found on PATH).", stacklevel=2)
    elif meteor:
        from pycocoevalcap.meteor.meteor import Meteor

        scorer = Meteor()
        try:
            out["METEOR"] = float(scorer.compute_score(gts, res)[0])
        except (ValueError, OSError) as e:  # Java died or answered nothing: the other scores still count
            warnings.warn(f"METEOR skipped: its Java process failed ({type(e).__name__}: {e}).", stacklevel=2)
        finally:
            _close_meteor(scorer)
    out["ROUGE-L"] = float(Rouge().compute_score(gts, res)[0])
    out["CIDEr-D"] = float(Cider().compute_score(gts, res)[0])
    if spice:
        try:
            from pycocoevalcap.spice.spice import Spice

            out["SPICE"] = float(Spice().compute_score(gts, res)[0])
        except Exception:  # SPICE downloads Stanford CoreNLP at first use: optional by design
            pass
    return out


def java_available() -> bool:
    """COCO's METEOR runs a Java program; without ``java`` it cannot be computed."""
    import shutil

    return shutil.which("java") is not None


def _close_meteor(scorer, wait_s: float = 5.0) -> None:
    """Stop METEOR's Java process and leave its lock free.

    pycocoevalcap's ``compute_score`` takes the scorer's lock without try/finally: after an error inside it the
    lock stays held, and waiting for it here (or in the scorer's ``__del__``) hangs forever; a training was once
    found blocked there for 90 minutes. So: wait a little, stop the process either way, then free the lock (a
    ``threading.Lock`` may be released by any thread) so that ``__del__`` finds it free."""
    proc = getattr(scorer, "meteor_p", None)
    lock = getattr(scorer, "lock", None)
    if proc is None:
        return
    if lock is not None:
        lock.acquire(timeout=wait_s)  # held or stuck: either way it is released below
    try:
        for stop in (proc.stdin.close, proc.kill, proc.wait):
            try:
                stop()
            except Exception:
                pass
    finally:
        if lock is not None and lock.locked():
            lock.release()


def nltk_bleu4(references: Sequence[Sequence[str]], candidates: Sequence[str]) -> float:
    import warnings

    from nltk.translate.bleu_score import corpus_bleu

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NLTK warns on every zero n-gram count; 0 is the answer we want
        return float(corpus_bleu([[r.split() for r in refs] for refs in references],
                                 [c.split() for c in candidates]))


# ---------------------------------------------------------------------------------------- attention correctness

def upsample_attention(alpha: np.ndarray | torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(h, w) attention -> (H, W) map summing to 1 (bilinear, as a heat map is drawn on the image)."""
    import torch  # here, not at the top: the scenes' caption rules import this module on the torch-free route
    import torch.nn.functional as F

    a = torch.as_tensor(np.asarray(alpha), dtype=torch.float32)[None, None]  # (1, 1, h, w)
    up = F.interpolate(a, size=size, mode="bilinear", align_corners=False)[0, 0].clamp_min(0)
    return up / up.sum().clamp_min(1e-12)


def box_mask(boxes: Sequence[Sequence[int]], size: tuple[int, int], image_size: tuple[int, int]) -> torch.Tensor:
    """Union of pixel boxes [x0, y0, x1, y1] given in an image of ``image_size`` (W, H), on a (H, W) grid."""
    import torch

    H, W = size
    sx, sy = W / image_size[0], H / image_size[1]
    mask = torch.zeros(H, W, dtype=torch.bool)
    for x0, y0, x1, y1 in boxes:
        mask[math.floor(y0 * sy): math.ceil(y1 * sy), math.floor(x0 * sx): math.ceil(x1 * sx)] = True
    return mask


def attention_entropy(alphas: Sequence[np.ndarray]) -> float:
    """Mean entropy (nats) of the per-word attention distributions; lower is sharper."""
    values = []
    for a in alphas:
        a = np.asarray(a, dtype=np.float64)
        if len(a):  # an empty caption has no words to attend for (reshape(0, -1) would fail)
            flat = a.reshape(len(a), -1)  # (T, H*W)
            values.extend((-(flat * np.log(np.clip(flat, 1e-12, None))).sum(1)).tolist())
    return float(np.mean(values)) if values else 0.0
