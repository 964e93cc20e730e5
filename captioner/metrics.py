"""Caption metrics: the COCO scorers (called one by one), NLTK BLEU as a cross-check, and for scenes with object
annotations, object precision/recall/F1 and attention correctness (Liu et al. 2017)."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from captioner.scenes.grammar import NUMBER_WORDS, PLURALS, SHAPE_WORDS, SIZE_WORDS
from captioner.scenes.world import COLORS


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


# ------------------------------------------------------------------------------------------- object accuracy

_SIZE = {w: s for s, ws in SIZE_WORDS.items() for w in ws}
_SHAPE = {w: s for s, ws in SHAPE_WORDS.items() for w in ws}
_SHAPE.update({PLURALS[w]: s for w, s in list(_SHAPE.items())})
_COUNT = {w: n for n, w in NUMBER_WORDS.items()} | {"a": 1, "an": 1}


def parse_objects(tokens: Sequence[str]) -> list[tuple[tuple[str, str, str], int, list[int]]]:
    """Noun phrases "[count] size colour shape" -> [((size, colour, shape), count, token positions)]."""
    found = []
    for i, tok in enumerate(tokens):
        if tok not in _SHAPE or i < 2:
            continue
        colour, size = tokens[i - 1], tokens[i - 2]
        if colour in COLORS and size in _SIZE:
            count = _COUNT.get(tokens[i - 3], 1) if i >= 3 else 1
            found.append(((_SIZE[size], colour, _SHAPE[tok]), count, [i - 2, i - 1, i]))
    return found


def object_counts(tokens: Sequence[str]) -> Counter:
    c: Counter = Counter()
    for key, count, _ in parse_objects(tokens):
        c[key] += count
    return c


def object_prf(generated: Sequence[Sequence[str]], scenes: Sequence[Sequence[dict]]) -> dict[str, float]:
    """Micro-averaged precision, recall and F1 of the (size, colour, shape) objects named vs. the scene's."""
    tp = n_pred = n_true = 0
    for tokens, objects in zip(generated, scenes):
        pred = object_counts(tokens)
        true = Counter((o["size"], o["color"], o["shape"]) for o in objects)
        tp += sum((pred & true).values())
        n_pred += sum(pred.values())
        n_true += sum(true.values())
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_true if n_true else 0.0
    return {"object_precision": p, "object_recall": r, "object_f1": 2 * p * r / (p + r) if p + r else 0.0}


# ---------------------------------------------------------------------------------------- attention correctness

def upsample_attention(alpha: np.ndarray | torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(h, w) attention -> (H, W) map summing to 1 (bilinear, as a heat map is drawn on the image)."""
    a = torch.as_tensor(np.asarray(alpha), dtype=torch.float32)[None, None]  # (1, 1, h, w)
    up = F.interpolate(a, size=size, mode="bilinear", align_corners=False)[0, 0].clamp_min(0)
    return up / up.sum().clamp_min(1e-12)


def box_mask(boxes: Sequence[Sequence[int]], size: tuple[int, int], image_size: tuple[int, int]) -> torch.Tensor:
    """Union of pixel boxes [x0, y0, x1, y1] given in an image of ``image_size`` (W, H), on a (H, W) grid."""
    H, W = size
    sx, sy = W / image_size[0], H / image_size[1]
    mask = torch.zeros(H, W, dtype=torch.bool)
    for x0, y0, x1, y1 in boxes:
        mask[math.floor(y0 * sy): math.ceil(y1 * sy), math.floor(x0 * sx): math.ceil(x1 * sx)] = True
    return mask


def attention_correctness(generated: Sequence[Sequence[str]], alphas: Sequence[np.ndarray],
                          scenes: Sequence[Sequence[dict]], image_size: tuple[int, int] = (224, 224),
                          map_size: tuple[int, int] = (224, 224)) -> dict[str, float]:
    """For every generated size/colour/shape word of a phrase that names an object in the scene, the share of
    its upsampled attention inside the union of the boxes of the matching objects; averaged over words.
    Also the same measure for uniform attention (the box area share) as the baseline."""
    shares, uniform = [], []
    for tokens, alpha, objects in zip(generated, alphas, scenes):
        for key, _, positions in parse_objects(tokens):
            boxes = [o["bbox"] for o in objects if (o["size"], o["color"], o["shape"]) == key]
            if not boxes:
                continue
            mask = box_mask(boxes, map_size, image_size)
            for pos in positions:
                if pos < len(alpha):
                    shares.append(float(upsample_attention(alpha[pos], map_size)[mask].sum()))
                    uniform.append(float(mask.float().mean()))
    if not shares:
        return {"attention_correctness": 0.0, "attention_uniform": 0.0, "attention_ratio": 0.0, "attention_words": 0}
    ac, un = float(np.mean(shares)), float(np.mean(uniform))
    return {"attention_correctness": ac, "attention_uniform": un, "attention_ratio": ac / un if un else 0.0,
            "attention_words": len(shares)}


def attention_entropy(alphas: Sequence[np.ndarray]) -> float:
    """Mean entropy (nats) of the per-word attention distributions; lower is sharper."""
    values = []
    for a in alphas:
        a = np.asarray(a, dtype=np.float64)
        if len(a):  # an empty caption has no words to attend for (reshape(0, -1) would fail)
            flat = a.reshape(len(a), -1)  # (T, H*W)
            values.extend((-(flat * np.log(np.clip(flat, 1e-12, None))).sum(1)).tolist())
    return float(np.mean(values)) if values else 0.0
