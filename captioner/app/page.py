"""The app's page layout: the Explore, Compare and Model card tabs, the two API endpoints and the events that
tie components to the handlers (which live in captioner.commands.app, beside the state they use)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from captioner.app.attention import SHOW_WORD_JS, attention_view
from captioner.app.views import PROB_COLOURS
from captioner.serving import MAX_BEAM_SIZE

# Requests handled at once: they decode their uploads in parallel and queue for the model, whose batcher runs them
# together (at most captioner.serving.batcher.MAX_WAITING waiting: past it, "busy"; a Compare queues two images);
# more requests than this wait in Gradio's queue, up to QUEUE_SIZE, before Gradio answers that it is full.
CONCURRENCY = 32
QUEUE_SIZE = 64
# Gradio's own temporary files (uploads, copies it serves): every 10 minutes, those older than an hour go.
DELETE_CACHE = (600, 3600)
EMPTY = "Upload an image or pick an example, then press Caption."


@dataclass(frozen=True)
class Handlers:
    """What the page's events call, each taking the components' values in the order the page wires them."""

    caption: Callable  # the /caption API: (image, beam size, checkpoint) -> (caption, overlays)
    explain: Callable  # the /explain API: (image, beam size, checkpoint[, regions]) -> JSON (/explain_regions: with)
    explore: Callable  # the Caption button: (image, beam size, checkpoint) -> every Explore output (the domain
    # notice first) and the state
    show_word: Callable  # (state, word number) -> highlighted caption (the overlay is redrawn in the browser)
    select_word: Callable  # (state, gr.SelectData) -> the word slider
    compare: Callable  # (image, beam size, left, right) -> (domain notice, left caption, right caption, rows)
    model_card: Callable  # (checkpoint) -> Markdown
    downloads: Callable  # (state, word number) -> [caption JSON, figure PNG, current word's overlay PNG]
    tell: Callable | None = None  # Point and tell: (image, beam size, checkpoint, boxes) -> the /explain answer


def page(choices: list[str], default: str, other: str, examples: list[str | Path] | None, handlers: Handlers,
         image_input: Callable[[], gr.Image], note: str = "") -> gr.Blocks:
    """The whole UI offering ``choices`` (short names; ``default`` selected, ``other`` on the Compare tab's right);
    ``note``: a line under the title (what this server leaves out)."""
    with gr.Blocks(title="captioner: Show, Attend and Tell", delete_cache=DELETE_CACHE) as demo:
        gr.Markdown("# Show, Attend and Tell\nUpload an image or pick an example: the model writes a caption and, "
                    "for each word, shows where it looked (brighter = more attention), how sure it was, and how "
                    "much of the image the word used (the gate β).")
        if note:
            gr.Markdown(note, elem_id="server-note")
        state = gr.State(None)
        with gr.Tab("Explore"):
            with gr.Row():
                with gr.Column(scale=1):
                    image = image_input()
                    if examples:
                        gr.Examples([[str(p)] for p in examples], inputs=[image], label="Examples")
                    beam = gr.Slider(1, MAX_BEAM_SIZE, value=3, step=1, label="Beam size (1 = greedy)")
                    checkpoint = gr.Dropdown(choices, value=default, label="Checkpoint", elem_id="checkpoint")
                    button = gr.Button("Caption", variant="primary", elem_id="caption-button")
                with gr.Column(scale=2):
                    # filled when the image is unlike the checkpoint's training images (domain check)
                    notice = gr.Markdown("", elem_id="domain-notice")
                    text = gr.Textbox(label="Caption", interactive=False, elem_id="caption-text", placeholder=EMPTY)
                    probs = gr.HighlightedText(label="Caption by word probability (click a word)",
                                               color_map=PROB_COLOURS, show_legend=True, elem_id="word-probs")
                    note = gr.Markdown("", elem_id="caption-note")
                    word = gr.Slider(1, 2, value=1, step=1, label="Word", interactive=False, elem_id="word-slider")
                    highlighted = gr.HighlightedText(label="Caption, word by word", color_map={"current": "orange"},
                                                     show_legend=False, elem_id="caption-words")
            # the overlays, drawn in the browser from each word's α grid: #word-overlay (large) and #overlays
            attention = attention_view()
            gr.Markdown("**Per word: probability, β and attention entropy**")
            chart = gr.HTML("", elem_id="word-chart")  # an SVG, drawn by the browser
            nbest = gr.Dataframe(headers=["rank", "caption", "score", "log-prob"],
                                 label="Beam search: n-best, ranked by score (log-prob / words ** length penalty)",
                                 interactive=False, elem_id="nbest", wrap=True,
                                 column_widths=["70px", "auto", "100px", "100px"])  # number columns stay whole
            downloads_button = gr.Button("Prepare downloads: caption JSON, figure PNG, this word's overlay PNG",
                                         elem_id="downloads-button", size="sm")
            downloads = gr.File(label="Downloads: caption JSON (tokens, probabilities, β, α maps), paper-style "
                                "figure and the current word's overlay (PNG)",
                                file_count="multiple", interactive=False, elem_id="downloads")
        with gr.Tab("Compare"):
            gr.Markdown("The same image through two checkpoints, word by word (uses the image and beam size of "
                        "the Explore tab).")
            with gr.Row():
                left = gr.Dropdown(choices, value=default, label="Left", elem_id="compare-left")
                right = gr.Dropdown(choices, value=other, label="Right", elem_id="compare-right")
            compare_button = gr.Button("Compare", elem_id="compare-button")
            compare_notice = gr.Markdown("", elem_id="compare-notice")  # as on Explore: an image unlike the data
            with gr.Row():
                left_text = gr.HighlightedText(label="Left", color_map=PROB_COLOURS, elem_id="compare-left-text")
                right_text = gr.HighlightedText(label="Right", color_map=PROB_COLOURS, elem_id="compare-right-text")
            table = gr.Dataframe(headers=["#", "left word", "left p", "right word", "right p"], interactive=False,
                                 elem_id="compare-table")
        if handlers.tell is not None:  # regions steer captions on the PyTorch route only (captioner.decoding.regions)
            from captioner.app.regions import regions_tab

            with gr.Tab("Point and tell"):
                regions_tab(image, beam, checkpoint, handlers.tell)
        with gr.Tab("Model card"):
            card = gr.Markdown(handlers.model_card(default), elem_id="model-card")
        explained = gr.JSON(visible=False)
        gallery = gr.Gallery(visible=False)  # /caption's overlays (the page draws its own in the browser)

        # The API: two endpoints with their own hidden triggers, so the page's richer event can change freely.
        api_caption = gr.Button(visible=False)
        api_caption.click(handlers.caption, [image, beam, checkpoint], [text, gallery], api_name="caption")
        api_explain = gr.Button(visible=False)
        api_explain.click(handlers.explain, [image, beam, checkpoint], [explained], api_name="explain")
        # /explain steered by regions (JSON boxes, docs/regions.md): its own endpoint, so that /explain's callers
        # keep sending three values (Gradio fills no missing input from a default)
        api_regions, api_explain_regions = gr.Textbox("", visible=False), gr.Button(visible=False)
        api_explain_regions.click(handlers.explain, [image, beam, checkpoint, api_regions], [explained],
                                  api_name="explain_regions")

        button.click(handlers.explore, [image, beam, checkpoint],
                     [notice, text, probs, note, word, attention, highlighted, chart, nbest, downloads, state],
                     api_name=False)
        word.change(None, [word], None, js=SHOW_WORD_JS)  # the overlay: redrawn in the browser, no request
        word.change(handlers.show_word, [state, word], [highlighted], api_name=False, concurrency_limit=None,
                    show_progress="hidden")
        downloads_button.click(handlers.downloads, [state, word], [downloads], api_name=False)
        probs.select(handlers.select_word, [state], [word], api_name=False)
        checkpoint.change(handlers.model_card, [checkpoint], [card], api_name=False)
        compare_button.click(handlers.compare, [image, beam, left, right],
                             [compare_notice, left_text, right_text, table],
                             api_name=False)
    demo.queue(default_concurrency_limit=CONCURRENCY, max_size=QUEUE_SIZE)
    return demo
