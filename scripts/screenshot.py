"""Screenshot of the app with a shipped checkpoint, for the README.

    python -m scripts.screenshot --out docs/img/app.png [--image datasets/shapes/images/test_00022.jpg]

Starts the app on a free local port with --checkpoint (the first, the default) and --compare, uploads the image in
headless Debian chromium (playwright), clicks Caption, moves the word view to --word, and saves a full-page
screenshot of the Explore tab (and, with --compare-out, one of the Compare tab).
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def _word_number(text: str) -> int:
    """The --word value: a whole number from 1, since the app's word slider starts at the first word."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"words are counted from 1 (the caption's first word), got {value}")
    return value


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default="checkpoints/shapes-soft", help="checkpoint to show (default: %(default)s)")
    p.add_argument("--compare", default="checkpoints/shapes-hard",
                   help="second checkpoint offered, for the Compare tab (default: %(default)s)")
    p.add_argument("--compare-out", default=None, help="also save a screenshot of the Compare tab here")
    p.add_argument("--image", default="datasets/shapes/images/test_00022.jpg", help="image to caption (default: %(default)s)")
    p.add_argument("--word", type=_word_number, default=6,
                   help="word shown large in the word view, counted from 1 as the app's slider counts "
                        "(default: %(default)s)")
    p.add_argument("--out", default="docs/img/app.png", help="PNG to write (default: %(default)s)")
    return p


def main(args: argparse.Namespace) -> int:
    import app
    from playwright.sync_api import sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folders = [Path(args.checkpoint)] + ([Path(args.compare)] if args.compare else [])
    demo = app.build_demo(folders)
    app.launch(demo, port=port, prevent_thread_lock=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            page.goto(f"http://127.0.0.1:{port}/", wait_until="load")  # not networkidle: the heartbeat stays open
            page.locator("#caption-button").wait_for(timeout=120_000)
            page.locator("input[type=file]").first.set_input_files(str(args.image))
            page.locator("#caption-button").click()
            page.wait_for_function("() => { const t = document.querySelector('#caption-text textarea');"
                                   " return t && t.value.length > 0; }", timeout=120_000)
            number = page.locator("#word-slider input[type=number]")
            words = int(float(number.get_attribute("max") or args.word))  # the slider ends at the last word
            if args.word > words:
                print(f"the caption has {words} words; showing word {words}, not {args.word}")
            shown = min(args.word, words)
            number.fill(str(shown))
            number.press("Enter")
            # the overlays are drawn in the browser: wait for the large one to show that word
            page.wait_for_function("n => document.querySelector('#word-overlay canvas')?.dataset.word === n",
                                   arg=str(shown), timeout=60_000)
            page.wait_for_timeout(1000)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=args.out, full_page=True)
            if args.compare_out:
                page.get_by_role("tab", name="Compare").click()
                page.locator("#compare-button").click()
                page.wait_for_function("() => ['#compare-left-text', '#compare-right-text'].every(s =>"
                                       " document.querySelectorAll(s + ' .token').length >= 2)", timeout=120_000)
                page.wait_for_timeout(1000)
                page.screenshot(path=args.compare_out, full_page=True)
            browser.close()
    finally:
        demo.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
