"""The explorer's pictures, pure (numbers in, images, SVG and rows out): the caption coloured by word probability,
the large per-word attention overlay with its colour bar (for the downloadable figure), the per-word chart (SVG,
drawn by the browser), the n-best rows."""

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
               chosen: list[float] | None = None) -> str:
    """Per-word chart as an SVG string (drawn by the browser, nothing rendered on the server): probability and beta
    (0..1) as bars, attention entropy (nats) as a line on its own axis on the right; for hard attention,
    ``chosen``: the probability of the location it would pick (the largest alpha)."""
    from html import escape

    n = max(len(tokens), 1)
    step, left, right, top, plot_h = 44, 48, 56, 36, 180
    width, height = left + n * step + right, top + plot_h + 70
    bottom = top + plot_h
    y = lambda v: bottom - max(0.0, min(1.0, v)) * plot_h  # noqa: E731 - the left axis, 0..1
    top_entropy = max([*entropies, 1e-9]) * 1.1
    ey = lambda v: bottom - v / top_entropy * plot_h  # noqa: E731 - the right axis, nats
    bar = 16 if betas is not None else 28
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">']
    for v in (0.0, 0.5, 1.0):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
                     f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    parts.append(f'<text x="12" y="{top + plot_h / 2}" transform="rotate(-90 12 {top + plot_h / 2})" '
                 'text-anchor="middle">probability / β</text>')
    parts.append(f'<text x="{width - right + 6}" y="{top - 6}">{top_entropy / 1.1:.2f} nats</text>'
                 f'<text x="{width - right + 6}" y="{bottom + 4}">0</text>')
    for i, word in enumerate(tokens):
        x = left + i * step + step / 2
        if betas is not None:
            parts.append(f'<rect class="p" x="{x - bar:.1f}" y="{y(probs[i]):.1f}" width="{bar}" '
                         f'height="{bottom - y(probs[i]):.1f}" fill="#1976d2"><title>p = {probs[i]:.3f}</title></rect>'
                         f'<rect class="beta" x="{x:.1f}" y="{y(betas[i]):.1f}" width="{bar}" '
                         f'height="{bottom - y(betas[i]):.1f}" fill="#ff9800"><title>β = {betas[i]:.3f}</title></rect>')
        else:
            parts.append(f'<rect class="p" x="{x - bar / 2:.1f}" y="{y(probs[i]):.1f}" width="{bar}" '
                         f'height="{bottom - y(probs[i]):.1f}" fill="#1976d2"><title>p = {probs[i]:.3f}</title></rect>')
        parts.append(f'<text x="{x:.1f}" y="{bottom + 14}" transform="rotate(-40 {x:.1f} {bottom + 14})" '
                     f'text-anchor="end">{escape(word)}</text>')
    xs = [left + i * step + step / 2 for i in range(len(tokens))]
    if chosen is not None:
        points = " ".join(f"{x:.1f},{y(v):.1f}" for x, v in zip(xs, chosen))
        parts.append(f'<polyline class="chosen" points="{points}" fill="none" stroke="#2e7d32" '
                     'stroke-dasharray="5,3" stroke-width="2"/>')
    points = " ".join(f"{x:.1f},{ey(v):.1f}" for x, v in zip(xs, entropies))
    parts.append(f'<polyline class="entropy" points="{points}" fill="none" stroke="#6a1b9a" stroke-width="2"/>')
    parts += [f'<circle cx="{x:.1f}" cy="{ey(v):.1f}" r="3" fill="#6a1b9a"><title>entropy = {v:.3f} nats</title>'
              '</circle>' for x, v in zip(xs, entropies)]
    legend = ([("p(chosen location)", "#2e7d32")] if chosen is not None else []) + [("p(word)", "#1976d2")] + \
        ([("β (gate)", "#ff9800")] if betas is not None else []) + [("attention entropy", "#6a1b9a")]
    x = left
    for label, colour in legend:
        parts.append(f'<rect x="{x}" y="8" width="12" height="12" fill="{colour}"/>'
                     f'<text class="legend" x="{x + 16}" y="18">{escape(label)}</text>')
        x += 24 + 7 * len(label)
    parts.append("</svg>")
    return "".join(parts)


def nbest_rows(nbest: list[dict]) -> list[list]:
    """Rank, caption, the score beam search ranked it by, and its log-probability (the two differ with a length
    penalty: log_prob / words ** penalty)."""
    return [[i + 1, h["text"], round(h.get("score", h["log_prob"]), 3), round(h["log_prob"], 3)]
            for i, h in enumerate(nbest)]
