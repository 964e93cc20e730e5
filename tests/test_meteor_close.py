"""METEOR's Java process is stopped, and its lock freed, even after pycocoevalcap's compute_score failed half-way."""

import subprocess
import sys
import threading

import pytest

from captioner.evaluation import metrics


class StuckScorer:
    """What pycocoevalcap's Meteor looks like after compute_score raised: its lock still held, Java still running."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lock.acquire()  # compute_score took it and never released it
        self.meteor_p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def compute_score(self, gts, res):
        raise ValueError("could not convert string to float: ''")  # Java answered an empty line


@pytest.mark.slow  # waits out _close_meteor's 5 s wait for the held lock
def test_close_does_not_hang_on_a_held_lock():
    scorer = StuckScorer()
    closing = threading.Thread(target=metrics._close_meteor, args=(scorer,), daemon=True)
    closing.start()
    closing.join(timeout=10)
    assert not closing.is_alive(), "closing METEOR waited for a lock that nobody will release"
    assert scorer.meteor_p.poll() is not None  # the process is gone
    assert not scorer.lock.locked()  # pycocoevalcap's __del__ takes this lock: it must be free


@pytest.mark.slow  # waits out _close_meteor's 5 s wait for the held lock
def test_a_failing_meteor_is_skipped_with_a_warning(monkeypatch):
    import pycocoevalcap.meteor.meteor as meteor_module

    made = []
    monkeypatch.setattr(metrics, "java_available", lambda: True)
    monkeypatch.setattr(meteor_module, "Meteor", lambda: made.append(StuckScorer()) or made[-1])
    with pytest.warns(UserWarning, match="METEOR skipped"):
        out = metrics.coco_scores([["a red circle"]], ["a red circle"], meteor=True)
    assert "METEOR" not in out and out["BLEU-1"] > 0.9 and "CIDEr-D" in out
    assert made[0].meteor_p.poll() is not None and not made[0].lock.locked()
