"""The explorer's pictures, pure (PIL / matplotlib in, images and rows out): the caption coloured by word
probability, the large per-word attention overlay with its colour bar, the per-word chart, the n-best rows."""

from __future__ import annotations

from PIL import Image

LARGE_SIDE = 1024  # the large overlay keeps the upload's own resolution up to this long side...
LARGE_MIN_SIDE = 480  # ...and a small image is enlarged to this, so the overlay is large on the page

PROB_BINS = [(0.9, "sure (p ≥ 0.9)"), (0.5, "likely (0.5–0.9)"), (0.0, "unsure (p < 0.5)")]
PROB_COLOURS = {"sure (p ≥ 0.9)": "#4caf50", "likely (0.5–0.9)": "#ffc107", "unsure (p < 0.5)": "#f44336",
                "cut": "#9e9e9e"}


def probability_words(tokens: list[str], probs: list[float], truncated: bool) -> list[tuple[str, str | None]]:
    """The caption as (word, probability bin) pairs; a caption cut at the length limit ends with a marker."""
    pairs: list[tuple[str, str | None]] = []
    for i, (word, p) in enumerate(zip(tokens, probs)):
        if i:
            pairs.append((" ", None))
        pairs.append((word, next(label for bound, label in PROB_BINS if p >= bound)))
    if truncated:
        pairs += [(" ", None), ("… (cut at the length limit)", "cut")]
    return pairs


def large_overlay(picture: Image.Image, alpha, word: str) -> Image.Image:
    """The word's attention on the picture at its own resolution (a long side outside LARGE_MIN_SIDE..LARGE_SIDE is
    scaled into it), with a colour bar."""
    import numpy as np
    from PIL import ImageDraw, ImageFont

    from captioner.viz import _colormap, overlay

    long_side = max(picture.size)
    scale = min(max(long_side, LARGE_MIN_SIDE), LARGE_SIDE) / long_side
    shown = picture if scale == 1 else picture.resize(
        (max(1, round(picture.width * scale)), max(1, round(picture.height * scale))), Image.Resampling.BICUBIC)
    ov = overlay(shown, alpha)
    bar_w, pad = 24, 64
    sheet = Image.new("RGB", (ov.width + bar_w + pad + 8, max(ov.height, 120)), "white")
    sheet.paste(ov, (0, 0))
    ramp = np.linspace(1.0, 0.0, ov.height, dtype=np.float32)[:, None].repeat(bar_w, 1)  # (H, bar_w): top = most
    sheet.paste(Image.fromarray(_colormap(ramp), "RGB"), (ov.width + 8, 0))
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default(size=13)
    top = float(np.asarray(alpha).max())
    x = ov.width + bar_w + 12
    draw.text((x, 2), f"{top:.3f}", fill="black", font=font)  # the map's largest weight (the bar's top)
    draw.text((x, ov.height - 18), "0", fill="black", font=font)
    draw.text((x, ov.height // 2 - 8), word[:8], fill="black", font=font)
    return sheet


def word_chart(tokens: list[str], probs: list[float], betas: list[float] | None, entropies: list[float],
               chosen: list[float] | None = None):
    """Per-word chart: probability and beta (0..1) as bars, attention entropy (nats) as a line on its own axis;
    for hard attention, ``chosen``: the probability of the location it would pick (the largest alpha)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(tokens) + 2), 3.2), dpi=100)
    x = list(range(len(tokens)))
    width = 0.4 if betas is not None else 0.7
    ax.bar([i - (width / 2 if betas is not None else 0) for i in x], probs, width, label="p(word)", color="#1976d2")
    if betas is not None:
        ax.bar([i + width / 2 for i in x], betas, width, label="β (gate)", color="#ff9800")
    if chosen is not None:
        ax.plot(x, chosen, "s--", color="#2e7d32", label="p(chosen location)")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(x, tokens, rotation=45, ha="right")
    ax.set_ylabel("probability / β")
    twin = ax.twinx()
    twin.plot(x, entropies, "o-", color="#6a1b9a", label="attention entropy")
    twin.set_ylabel("entropy (nats)")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1.22), ncol=4, frameon=False)
    fig.tight_layout()
    return fig


def nbest_rows(nbest: list[dict]) -> list[list]:
    """Rank, caption, the score beam search ranked it by, and its log-probability (the two differ with a length
    penalty: log_prob / words ** penalty)."""
    return [[i + 1, h["text"], round(h.get("score", h["log_prob"]), 3), round(h["log_prob"], 3)]
            for i, h in enumerate(nbest)]
