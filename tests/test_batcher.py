"""The batcher in front of the model: concurrent jobs share a batch, the queue is bounded ("busy" at once past it),
and one bad input fails only its own request; through the app, concurrent captions equal one-at-a-time ones."""

import threading
import time

import pytest
import torch
from PIL import Image

from captioner.serving import Batcher, Busy, explain_batch
from test_app import WORDS, make_checkpoint, make_images


class Gate:
    """A run_batch that records each batch and holds the first one until released (so others queue behind it)."""

    def __init__(self, fail_on=None):
        self.batches: list[tuple] = []
        self.release = threading.Event()
        self.started = threading.Event()
        self.fail_on = fail_on

    def __call__(self, key, items):
        self.batches.append((key, list(items)))
        self.started.set()
        self.release.wait(10)
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError(f"bad item {self.fail_on}")
        return [(key, item * 10) for item in items]


def test_call_runs_in_the_worker_thread_between_batches():
    gate = Gate()
    batcher = Batcher(gate, name="model-thread")
    held = batcher.submit("a", 1)
    assert gate.started.wait(5)
    threading.Timer(0.2, gate.release.set).start()  # the call waits for the batch the worker is running
    assert batcher.call(lambda x: (threading.current_thread().name, x, held.done()), 7) == ("model-thread", 7, True)
    with pytest.raises(ZeroDivisionError):
        batcher.call(lambda: 1 / 0)
    assert batcher.submit("a", 2).result(5) == ("a", 20)  # the worker lives on after a failed call


def test_waiting_jobs_of_one_key_share_a_batch_in_order():
    gate = Gate()
    batcher = Batcher(gate, max_batch=4, max_waiting=16)
    first = batcher.submit("a", 0)
    assert gate.started.wait(5)  # the worker holds job 0: the rest queue behind it
    futures = [batcher.submit("a" if i % 3 else "b", i) for i in range(1, 8)]
    assert batcher.report()["waiting"] == 7 and batcher.report()["running"] == 1
    gate.release.set()
    assert first.result(5) == ("a", 0)
    assert [f.result(5) for f in futures] == [("a" if i % 3 else "b", i * 10) for i in range(1, 8)]
    keys_and_items = [(key, items) for key, items in gate.batches]
    # job 0 alone, then the oldest waiting job's key ("a": 1, 2, 4, 5 up to max_batch), then "b" (3, 6), then "a" (7)
    assert keys_and_items == [("a", [0]), ("a", [1, 2, 4, 5]), ("b", [3, 6]), ("a", [7])]
    report = batcher.report()
    assert report["batches"] == 4 and report["mean_batch"] == 2.0 and report["waiting"] == 0


def test_past_the_bound_a_request_is_refused_at_once():
    gate = Gate()
    batcher = Batcher(gate, max_batch=8, max_waiting=2)
    running = batcher.submit("a", 0)
    assert gate.started.wait(5)
    waiting = [batcher.submit("a", 1), batcher.submit("a", 2)]
    start = time.perf_counter()
    with pytest.raises(Busy, match="busy.*try again"):
        batcher.submit("a", 3)
    assert time.perf_counter() - start < 0.5  # refused at once, not after a wait
    gate.release.set()
    assert running.result(5) == ("a", 0) and [f.result(5)[1] for f in waiting] == [10, 20]
    assert batcher.submit("a", 4).result(5) == ("a", 40)  # room again once the queue drains


def test_one_bad_item_fails_only_its_own_request():
    gate = Gate(fail_on=2)
    gate.release.set()
    hold = threading.Event()
    batcher = Batcher(lambda key, items: hold.wait(10) and gate(key, items), max_batch=8)
    first = batcher.submit("a", 0)
    wait_for(lambda: batcher.running == 1)  # the worker holds job 0
    futures = [batcher.submit("a", i) for i in (1, 2, 3)]  # queued together behind it
    hold.set()
    assert first.result(5) == ("a", 0)
    assert futures[0].result(5) == ("a", 10) and futures[2].result(5) == ("a", 30)
    with pytest.raises(ValueError, match="bad item 2"):
        futures[1].result(5)
    assert [items for _, items in gate.batches] == [[0], [1, 2, 3], [1], [2], [3]]  # the failed batch, one by one


def test_an_exception_as_a_result_fails_only_that_item():
    batcher = Batcher(lambda key, items: [ValueError("no") if i < 0 else i for i in items])
    assert batcher.run("k", 5) == 5
    with pytest.raises(ValueError):
        batcher.run("k", -1)


def wait_for(condition, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < end:
        time.sleep(0.005)
    assert condition()


# ---- the real model -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import captioner

    root = tmp_path_factory.mktemp("batcher")
    folder = make_checkpoint(root / "ckpt")
    return captioner.load(folder), folder, make_images(root / "images")


def test_a_batch_explains_each_image_as_it_would_alone(tiny):
    model, _, images = tiny
    pictures = [Image.open(p).convert("RGB") for p in images] + [Image.new("RGB", (90, 300), "green")]
    inputs = [model.transform(p) for p in pictures]
    sizes = [p.size for p in pictures]
    together = explain_batch(model, inputs, sizes, 3, [True, False, True])
    for i, picture in enumerate(pictures):
        alone = explain_batch(model, [inputs[i]], [sizes[i]], 3)[0]
        assert together[i].text == alone.text and len(together[i].tokens) == WORDS
        assert together[i].alphas.shape == alone.alphas.shape
        assert abs(together[i].alphas - alone.alphas).max() < 1e-4
        assert [h["text"] for h in together[i].nbest] == [h["text"] for h in alone.nbest]
        if i != 1:
            assert together[i].word_probs == pytest.approx(alone.word_probs, abs=1e-5)
            assert together[i].entropies == pytest.approx(alone.entropies, abs=1e-4)
            assert together[i].betas == pytest.approx(alone.betas, abs=1e-5)
        else:  # not measured: the /caption path skips the teacher-forced pass
            assert together[i].word_probs == [] and together[i].betas is None


def test_the_apps_batcher_isolates_a_non_finite_image_and_reports_its_queue(tiny, monkeypatch):
    from captioner.commands import app as app_impl

    model, folder, images = tiny
    good = [Image.open(p).convert("RGB") for p in images]

    class NaNPicture:  # a decoded picture whose preprocessed tensor is NaN: the model's scores become NaN
        size = (160, 128)

    real_transform = model.transform
    monkeypatch.setattr(model, "transform", lambda p: torch.full_like(real_transform(good[0]), float("nan"))
                        if isinstance(p, NaNPicture) else real_transform(p))
    monkeypatch.setattr(app_impl.MODELS, "get", lambda folder: model)
    batcher = Batcher(app_impl._run_batch, max_batch=8)
    monkeypatch.setattr(app_impl, "BATCHER", batcher)
    key = (folder.resolve(), 3, None)  # (checkpoint, beam size, no regions)
    hold = threading.Event()
    real = batcher.run_batch
    batcher.run_batch = lambda k, items: hold.wait(10) and real(k, items)
    futures = [batcher.submit(key, (picture, True, None)) for picture in (good[0], NaNPicture(), good[1])]
    state = app_impl.ServerState(queue=batcher.report)
    assert state.report()["queue"]["waiting"] + state.report()["queue"]["running"] == 3
    hold.set()
    assert futures[0].result(30).text and futures[2].result(30).text
    with pytest.raises(Exception, match="not finite|NaN"):
        futures[1].result(30)


def test_concurrent_predictions_share_batches_and_match_single_ones(tiny, monkeypatch):
    import app
    from captioner.commands import app as app_impl

    _, folder, images = tiny
    batcher = Batcher(app_impl._run_batch)
    monkeypatch.setattr(app_impl, "BATCHER", batcher)
    alone = {str(p): app.explain_json(str(p), 3, str(folder)) for p in images}
    assert batcher.batches == 2
    # the first concurrent batch (one request, or more that arrived together) is held until all eight are in the
    # batcher: the ones waiting behind it must then share one batch
    real = batcher.run_batch
    batcher.run_batch = lambda k, items: (batcher.batches > 2 or wait_for(
        lambda: batcher.waiting + batcher.running >= 8) or True) and real(k, items)
    answers, errors = {}, []

    def ask(i):
        try:
            path = str(images[i % 2])
            answers[i] = (path, app.explain_json(path, 3, str(folder)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(answers) == 8
    for path, answer in answers.values():
        assert answer["text"] == alone[path]["text"]
        assert answer["word_probs"] == pytest.approx(alone[path]["word_probs"], abs=1e-5)
    assert batcher.jobs == 10 and batcher.batches <= 4  # the two alone, then the eight in at most two batches
