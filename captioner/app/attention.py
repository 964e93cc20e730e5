"""The explorer's attention view, drawn in the browser: the page gets each word's α map as a small grid of numbers
(one uint8 per location, hex) and the picture once, and blends them on a canvas at the picture's own resolution,
as ``captioner.viz.overlay`` does on the server (the same colour map, weights and normalisation); the word slider
redraws it without a request. One large overlay with its colour bar (``#word-overlay``) and a gallery of every word
(``#overlays``)."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
from PIL import Image

from captioner.app.views import LARGE_MIN_SIDE, LARGE_SIDE

GALLERY_SIDE = 224  # each word's overlay in the gallery: long side in pixels
STRENGTH = 0.55  # as captioner.viz.overlay: weight of the colour at the strongest attention


def _turbo_hex() -> str:
    from captioner.viz import _turbo_table

    return bytes(_turbo_table().astype(np.uint8).reshape(-1)).hex()  # 256 levels x RGB


def shown_size(size: tuple[int, int]) -> tuple[int, int]:
    """The large overlay's size: the picture's own, a long side outside LARGE_MIN_SIDE..LARGE_SIDE scaled into it."""
    width, height = size
    long_side = max(width, height)
    scale = min(max(long_side, LARGE_MIN_SIDE), LARGE_SIDE) / long_side
    return max(1, round(width * scale)), max(1, round(height * scale))


def alpha_levels(alpha: np.ndarray) -> tuple[str, float]:
    """One word's map (h, w) as hex uint8 levels (normalised to its largest weight, as viz.overlay does) and that
    largest weight."""
    a = np.asarray(alpha, dtype=np.float32)
    peak = float(a.max()) if a.size else 0.0
    levels = (a / peak * 255).astype(np.uint8) if peak > 0 else np.zeros(a.shape, np.uint8)
    return levels.tobytes().hex(), peak


def picture_url(picture: Image.Image, side: int = LARGE_SIDE) -> str:
    """The picture (long side at most ``side``) as a JPEG data: URL, sent once with the maps."""
    from captioner.images import to_rgb

    small = to_rgb(picture)
    if max(small.size) > side:
        small = small.copy()
        small.thumbnail((side, side))
    buffer = io.BytesIO()
    small.save(buffer, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def attention_payload(picture: Image.Image, tokens: list[str], alphas: np.ndarray) -> str:
    """The view's value: JSON with the picture, its shown size, the grid size and each word's levels and peak."""
    levels = [alpha_levels(a) for a in alphas]
    width, height = shown_size(picture.size)
    grid = list(alphas.shape[1:]) if len(alphas) else [0, 0]
    return json.dumps({"image": picture_url(picture), "width": width, "height": height, "grid": grid,
                       "gallery": GALLERY_SIDE, "words": tokens, "levels": [hex_ for hex_, _ in levels],
                       "peaks": [round(peak, 4) for _, peak in levels]}, separators=(",", ":"))


TEMPLATE = """<div class="attention-view">
  <div class="attention-title">Attention for the current word (on the image at its own resolution)</div>
  <div id="word-overlay" class="attention-large"><p class="attention-empty">Each word's attention appears here
    after a caption.</p></div>
  <div class="attention-title">Attention per word</div>
  <div id="overlays" class="attention-gallery"></div>
</div>"""

CSS = """
.attention-title { font-weight: 600; margin: 8px 0 4px; }
.attention-large { display: flex; gap: 8px; align-items: stretch; }
.attention-large canvas { max-width: calc(100% - 90px); max-height: 480px; width: auto; height: auto; }
.attention-bar { display: flex; gap: 4px; font-size: 13px; }
.attention-ramp { width: 24px; }
.attention-labels { display: flex; flex-direction: column; justify-content: space-between; }
.attention-gallery { display: flex; flex-wrap: wrap; gap: 8px; }
.attention-gallery figure { margin: 0; text-align: center; font-size: 13px; }
.attention-gallery canvas { max-width: 160px; height: auto; }
"""

# js_on_load of gr.HTML: ``element`` is the component, ``props.value`` the payload; ``watch`` redraws on a new one.
JS = """
const TURBO = '__TURBO__';
const COLOURS = new Float32Array(768), WEIGHTS = new Float32Array(256);
for (let i = 0; i < 768; i++) COLOURS[i] = parseInt(TURBO.substr(2 * i, 2), 16);
for (let i = 0; i < 256; i++) WEIGHTS[i] = __STRENGTH__ * Math.pow(i / 255, 0.8);
let data = null, picture = null, current = 0;

function grid(hex, gh, gw) {  // the word's levels as a gh x gw grey image
  const c = document.createElement('canvas');
  c.width = gw; c.height = gh;
  const ctx = c.getContext('2d'), img = ctx.createImageData(gw, gh);
  for (let i = 0; i < gw * gh; i++) {
    const v = parseInt(hex.substr(2 * i, 2), 16);
    img.data[4 * i] = img.data[4 * i + 1] = img.data[4 * i + 2] = v; img.data[4 * i + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
  return c;
}

function blend(canvas, word) {  // the picture with word's attention upsampled to the canvas, as viz.overlay
  const W = canvas.width, H = canvas.height, ctx = canvas.getContext('2d', {willReadFrequently: true});
  ctx.imageSmoothingEnabled = true; ctx.imageSmoothingQuality = 'high';
  ctx.drawImage(picture, 0, 0, W, H);
  const base = ctx.getImageData(0, 0, W, H);
  const heat = document.createElement('canvas');
  heat.width = W; heat.height = H;
  const hctx = heat.getContext('2d', {willReadFrequently: true});
  hctx.imageSmoothingEnabled = true; hctx.imageSmoothingQuality = 'high';
  hctx.drawImage(grid(data.levels[word], data.grid[0], data.grid[1]), 0, 0, W, H);
  const level = hctx.getImageData(0, 0, W, H).data, px = base.data;
  for (let p = 0; p < px.length; p += 4) {
    const l = level[p], w = WEIGHTS[l];
    px[p] = px[p] * (1 - w) + COLOURS[3 * l] * w;
    px[p + 1] = px[p + 1] * (1 - w) + COLOURS[3 * l + 1] * w;
    px[p + 2] = px[p + 2] * (1 - w) + COLOURS[3 * l + 2] * w;
  }
  ctx.putImageData(base, 0, 0);
}

function ramp() {  // the colour bar: the strongest attention at the top
  const stops = [];
  for (let i = 255; i >= 0; i -= 15) stops.push(`rgb(${COLOURS[3 * i]},${COLOURS[3 * i + 1]},${COLOURS[3 * i + 2]})`);
  return `linear-gradient(${stops.join(',')})`;
}

function showWord(number) {  // 1-based, as the slider counts
  if (!data || !picture || !data.words.length) return;
  current = Math.min(Math.max(Math.round(number) || 1, 1), data.words.length) - 1;
  const large = element.querySelector('#word-overlay');
  large.innerHTML = '';
  const canvas = document.createElement('canvas');
  canvas.width = data.width; canvas.height = data.height;
  blend(canvas, current);
  canvas.dataset.word = String(current + 1);
  const bar = document.createElement('div');
  bar.className = 'attention-bar';
  bar.innerHTML = `<div class="attention-ramp" style="background:${ramp()}"></div><div class="attention-labels">` +
    `<span>${data.peaks[current].toFixed(3)}</span><span class="attention-word"></span><span>0</span></div>`;
  bar.querySelector('.attention-word').textContent = data.words[current].slice(0, 12);
  bar.style.height = 'auto';
  large.append(canvas, bar);
}

function draw() {
  const large = element.querySelector('#word-overlay'), gallery = element.querySelector('#overlays');
  if (!large || !gallery) return;
  data = props.value ? JSON.parse(props.value) : null;
  gallery.innerHTML = '';
  if (!data || !data.words.length) {
    large.innerHTML = '<p class="attention-empty">Each word\\'s attention appears here after a caption.</p>';
    return;
  }
  const img = new Image(), shown = data;
  img.onload = () => {
    if (data !== shown) return;  // a newer caption arrived meanwhile
    picture = img;
    const scale = data.gallery / Math.max(data.width, data.height);
    data.words.forEach((word, i) => {
      const figure = document.createElement('figure'), canvas = document.createElement('canvas');
      canvas.width = Math.max(1, Math.round(data.width * scale));
      canvas.height = Math.max(1, Math.round(data.height * scale));
      blend(canvas, i);
      canvas.dataset.word = String(i + 1);
      const label = document.createElement('figcaption');
      label.textContent = `${i + 1}: ${word}`;
      figure.append(canvas, label);
      gallery.append(figure);
    });
    showWord(1);
  };
  img.src = data.image;
}

window.captionerAttention = {showWord};  // the word slider's client-side event calls it
watch('value', draw);
draw();
"""

# The word slider's client-side event: redraw the large overlay for its word, no request to the server.
SHOW_WORD_JS = "(word) => { if (window.captionerAttention) window.captionerAttention.showWord(word); return []; }"


def attention_view() -> "gr.HTML":  # noqa: F821 - gradio is imported inside
    """The gr.HTML component that draws the overlays in the browser (value: ``attention_payload`` or "")."""
    import gradio as gr

    js = JS.replace("__TURBO__", _turbo_hex()).replace("__STRENGTH__", str(STRENGTH))
    return gr.HTML("", html_template=TEMPLATE, css_template=CSS, js_on_load=js, elem_id="attention-view",
                   apply_default_css=True, padding=False)
