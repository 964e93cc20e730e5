"""The app in a real headless browser (Debian's chromium driven by playwright; never `playwright install`).

Tests never install anything: without /usr/bin/chromium (install it with `make browser-deps`) or without playwright
this module is skipped and says why. CI (.ci/run) installs chromium first and sets CAPTIONER_REQUIRE_BROWSER=1,
which turns that skip into a failure, so CI always runs the browser.
Set CAPTIONER_SCREENSHOT=path/to/file.png to keep the screenshot.
"""

import json
import os
import shutil
from pathlib import Path
from urllib.parse import urlparse

import pytest

from test_app import WORDS, make_bad_files, make_checkpoint, make_images, running_app

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}

# A real browser (chromium through playwright) driving the app: the integration tier.
pytestmark = pytest.mark.integration


def browser_missing() -> str | None:
    """Why the browser cannot run here, or None. Finding only: installing is `make browser-deps`'s job."""
    if not CHROMIUM.is_file() or not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is not installed (run `make browser-deps`; tests never install system packages)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as e:
        return f"playwright cannot be imported ({e}; it is in requirements.txt)"
    return None


@pytest.fixture(scope="module")
def browser():
    reason = browser_missing()
    if reason and os.environ.get("CAPTIONER_REQUIRE_BROWSER", "") not in ("", "0"):
        pytest.fail(f"CAPTIONER_REQUIRE_BROWSER is set but {reason}")
    if reason:
        pytest.skip(reason)
    from playwright import sync_api
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=FLAGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    return {"checkpoint": make_checkpoint(root / "ckpt"), "images": make_images(root / "images"),
            "bad": make_bad_files(root / "bad"), "cache": root / "overlays"}


@pytest.fixture(scope="module")
def server(files):
    other = files["checkpoint"].parent / "other"
    shutil.copytree(files["checkpoint"], other)  # a second name to compare with
    with running_app({"ckpt": files["checkpoint"], "other": other}, files["cache"], examples=files["images"]) as url:
        yield url


@pytest.fixture
def page(browser, server):
    """A fresh page whose route guard aborts (and records) every request that leaves this machine."""
    context = browser.new_context(viewport={"width": 1280, "height": 1100})
    page = context.new_page()
    outside: list[str] = []

    def guard(route):
        if urlparse(route.request.url).hostname in LOCAL_HOSTS or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", guard)
    open_page(page, server)
    yield page
    context.close()
    assert not outside, f"the page tried to reach the internet: {outside[:5]}"


def open_page(page, url: str) -> None:
    """Load the page (not "networkidle": a page with session state keeps Gradio's heartbeat stream open)."""
    page.goto(url, wait_until="load")
    page.locator("#caption-button").wait_for(timeout=60_000)
    page.wait_for_timeout(500)


def upload_and_caption(page, path: Path) -> None:
    page.locator("input[type=file]").first.set_input_files(str(path))
    page.locator("#caption-button").click()


def wait_for_caption(page, previous: str = "") -> str:
    page.wait_for_function("prev => { const t = document.querySelector('#caption-text textarea');"
                           " return t && t.value.length > 0 && t.value !== prev; }", arg=previous, timeout=60_000)
    return page.locator("#caption-text textarea").input_value()


def drawn_canvases(page, selector: str, count: int) -> list[list[int]]:
    """[width, height] of every canvas under ``selector`` (the overlays the page draws from the α grids), once
    ``count`` of them are drawn."""
    page.wait_for_function(f"n => document.querySelectorAll('{selector} canvas[data-word]').length >= n",
                           arg=count, timeout=60_000)
    return page.eval_on_selector_all(f"{selector} canvas[data-word]", "cs => cs.map(c => [c.width, c.height])")


def large_word(page) -> tuple[str, str]:
    """(word number, pixels as a data: URL) of the large overlay."""
    return page.eval_on_selector("#word-overlay canvas", "c => [c.dataset.word, c.toDataURL()]")


def error_text(page) -> str:
    toast = page.locator(".toast-body").last
    toast.wait_for(timeout=60_000)
    return toast.inner_text()


# ---- checks shared with test_onnx_app_venv.py (the same page served on ONNX Runtime) ------------------------------

def check_overlays_and_word_view(page, image: Path, words: int | None = None) -> str:
    """Caption ``image``: one 224-px overlay per word (``words`` of them when given, at least 3), drawn in the
    browser and not all alike; the slider moves the large overlay to word 3 and the highlight follows. Returns the
    caption."""
    upload_and_caption(page, image)
    caption = wait_for_caption(page)
    count = len(caption.split())
    assert count == words if words is not None else count >= 3, caption
    sizes = drawn_canvases(page, "#overlays", count)
    assert len(sizes) == count and all(w == 224 for w, h in sizes), sizes  # one per word, 224 px long side
    pixels = page.eval_on_selector_all("#overlays canvas", "cs => cs.map(c => c.toDataURL())")
    assert len(set(pixels)) > 1  # the words attend to different places: the overlays differ
    assert "1: " + caption.split()[0] in page.locator("#overlays").inner_text()

    drawn_canvases(page, "#word-overlay", 1)
    first = large_word(page)
    assert first[0] == "1"
    number = page.locator("#word-slider input[type=number]")
    number.fill("3")
    number.press("Enter")
    page.wait_for_function("() => document.querySelector('#word-overlay canvas')?.dataset.word === '3'",
                           timeout=30_000)
    assert large_word(page)[1] != first[1]  # redrawn in the browser with word 3's map
    page.wait_for_function("() => /current/i.test(document.querySelector('#caption-words').innerText)",
                           timeout=30_000)
    shown = page.locator("#caption-words").inner_text().replace("Caption, word by word", "").split()
    assert [t.lower() for t in shown].index("current") == 3  # the label follows word 3
    assert [t for t in shown if t.lower() != "current"] == caption.split()
    return caption


def check_chart_and_nbest(page, caption: str) -> None:
    """The chart has a probability bar per word; the n-best table lists the caption."""
    page.locator("#word-chart svg rect.p").first.wait_for(timeout=30_000)
    assert page.locator("#word-chart svg rect.p").count() == len(caption.split())
    assert caption in page.locator("#nbest").inner_text()


def check_downloads(page, caption: str) -> None:
    """Nothing is written before it is asked for; then the caption JSON (with every word's α map) downloads."""
    assert page.locator("#downloads a").count() == 0
    page.locator("#downloads-button").click()
    links = page.locator("#downloads a")
    links.first.wait_for(timeout=30_000)
    json_link = next(links.nth(i) for i in range(links.count())
                     if ".json" in (links.nth(i).get_attribute("href") or ""))
    with page.expect_download() as info:
        json_link.click()
    data = json.loads(Path(info.value.path()).read_text())
    assert data["text"] == caption and len(data["alphas"]) == len(data["tokens"]) == len(data["word_probs"])
    assert any(".png" in (links.nth(i).get_attribute("href") or "") for i in range(links.count()))  # the figure


def check_compare(page) -> tuple[str, str]:
    """The Compare tab: two captions side by side, coloured word by word; returns their texts (left, right)."""
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-button").click()
    page.wait_for_function("() => ['#compare-left-text', '#compare-right-text'].every(s =>"
                           " document.querySelectorAll(s + ' .token').length >= 3)", timeout=60_000)
    return page.locator("#compare-left-text").inner_text(), page.locator("#compare-right-text").inner_text()


# ---- the tests -------------------------------------------------------------------------------------------------------

def test_caption_overlays_and_word_view(page, files, tmp_path):
    check_overlays_and_word_view(page, files["images"][0], WORDS)
    shot = tmp_path / "app.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("CAPTIONER_SCREENSHOT"):
        target = Path(os.environ["CAPTIONER_SCREENSHOT"])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)


@pytest.mark.parametrize("bad,message", [("not_an_image", "not an image"), ("bomb", "too many pixels")])
def test_bad_upload_shows_an_error_and_server_keeps_answering(page, files, bad, message):
    text, bomb = files["bad"]
    upload_and_caption(page, text if bad == "not_an_image" else bomb)
    assert message in error_text(page)
    page.reload(wait_until="load")
    page.locator("#caption-button").wait_for(timeout=60_000)
    upload_and_caption(page, files["images"][1])
    assert len(wait_for_caption(page).split()) == WORDS
    assert all(w > 0 for w, h in drawn_canvases(page, "#overlays", WORDS))


def test_empty_state_says_what_to_do(page):
    text = page.locator("body").inner_text()
    assert "Upload an image or pick an example" in (text + page.locator("#caption-text textarea").get_attribute(
        "placeholder"))
    assert "Drop Media Here" not in page.locator("#overlays").inner_text()
    assert "Drop" not in page.locator("#word-overlay").inner_text()


def test_explorer_views(page, files, tmp_path):
    upload_and_caption(page, files["images"][1])
    caption = wait_for_caption(page)
    # Words coloured by probability, with the cut marker (the tiny model never ends its captions).
    page.wait_for_function("() => document.querySelector('#word-probs').innerText.includes('cut at the length')",
                           timeout=30_000)
    assert "Cut at the length limit" in page.locator("#caption-note").inner_text()
    # Clicking the third word moves the large overlay and the slider to it.
    drawn_canvases(page, "#word-overlay", 1)
    page.locator("#word-probs .token").nth(4).click()  # spans: word, space, word, space, word
    page.wait_for_function("() => document.querySelector('#word-overlay canvas')?.dataset.word === '3'",
                           timeout=30_000)
    assert page.locator("#word-slider input[type=number]").input_value() == "3"
    # The large overlay: the image (160x128 here) drawn at a 480-px long side, not the 224-px gallery size,
    # with its colour bar beside it.
    assert drawn_canvases(page, "#word-overlay", 1) == [[480, 384]]
    assert page.locator("#word-overlay .attention-ramp").is_visible()
    # Chart, n-best, downloads (written only when asked for).
    check_chart_and_nbest(page, caption)
    check_downloads(page, caption)
    # Compare: two captions side by side.
    assert caption.split()[0] in check_compare(page)[1]
    page.get_by_role("tab", name="Model card").click()
    page.locator("#model-card").wait_for(timeout=10_000)


def test_no_server_path_reaches_the_browser(page, server, files):
    """An example image captioned by a click: every URL the page asks for, every src/href and the page text name
    files by opaque name (files/<id>/<name>), never by a server path."""
    import tempfile

    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    open_page(page, server)
    page.locator("#caption-button").wait_for()
    page.locator("button.gallery-item").first.click()  # the first example (circle.png)
    page.wait_for_function("() => { const i = document.querySelector('#image-input img');"
                           " return i && i.complete && i.naturalWidth > 0; }", timeout=30_000)
    page.locator("#caption-button").click()
    caption = wait_for_caption(page)
    assert len(caption.split()) == WORDS and all(w > 0 for w, h in drawn_canvases(page, "#overlays", WORDS))
    page.locator("#downloads-button").click()
    page.locator("#downloads a").first.wait_for(timeout=30_000)
    links = page.eval_on_selector_all("img[src], a[href]", "els => els.map(e => e.src || e.href)")
    served = [u for u in asked + links if "/files/" in u]
    assert any(u.endswith("/circle.png") for u in served) and any(u.endswith(".json") for u in links)
    html = page.content()
    for text in asked + links + [html]:
        for path in ("/tmp/", tempfile.gettempdir() + "/", "file=/", str(ROOT), str(files["cache"])):
            assert path not in text, (path, text[:300])


def test_photo_gets_the_out_of_domain_notice_above_the_caption(browser, tmp_path):
    """The shipped shapes model: a real photo gets the notice (naming the training data), a new scene does not."""
    import skimage.data
    from PIL import Image

    from captioner.scenes.shapes import make_image

    shipped = ROOT / "checkpoints" / "shapes-soft"
    if not (shipped / "domain.safetensors").is_file():
        pytest.skip("the shipped checkpoint with its domain.safetensors is not here")
    Image.fromarray(skimage.data.chelsea()).save(tmp_path / "cat.png")
    make_image(31337, "test", 1)[0].save(tmp_path / "scene.png")  # a seed no dataset of the project uses
    with running_app({"shapes-soft": shipped}, tmp_path / "cache") as url:
        context = browser.new_context(viewport={"width": 1280, "height": 1100})
        page = context.new_page()
        try:
            open_page(page, url)
            upload_and_caption(page, tmp_path / "cat.png")
            caption = wait_for_caption(page)
            page.wait_for_function("() => document.querySelector('#domain-notice').innerText.includes('unlike')",
                                   timeout=30_000)
            notice = page.locator("#domain-notice")
            assert "trained on synthetic shapes" in notice.inner_text()
            assert notice.bounding_box()["y"] < page.locator("#caption-text").bounding_box()["y"]  # above it
            if os.environ.get("CAPTIONER_SCREENSHOT"):
                page.screenshot(path=os.environ["CAPTIONER_SCREENSHOT"])
            page.get_by_role("tab", name="Compare").click()  # the Compare tab says it too, above both captions
            page.locator("#compare-button").click()
            page.wait_for_function("() => document.querySelector('#compare-notice').innerText.includes('unlike')",
                                   timeout=60_000)
            assert "Both (shapes-soft, shapes-soft)" in page.locator("#compare-notice").inner_text()
            page.get_by_role("tab", name="Explore").click()
            upload_and_caption(page, tmp_path / "scene.png")
            wait_for_caption(page, caption)
            page.wait_for_function("() => !document.querySelector('#domain-notice').innerText.includes('unlike')",
                                   timeout=30_000)
        finally:
            context.close()
