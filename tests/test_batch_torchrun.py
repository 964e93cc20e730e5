"""caption.py under torchrun: each image captioned once by one process, parts merged in input order, resume after
one rank is killed with SIGKILL, and a rerun with another number of processes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from PIL import Image

import caption
from captioner.batch.captioning import shard
from captioner.batch.records import merge_parts
from captioner.errors import CaptionerError
from test_batch import checkpoint, scenes  # noqa: F401 - the tiny model and its scenes, shared fixtures

ROOT = Path(__file__).resolve().parents[1]
LOG_PROB_TOL = 1e-5  # another batch composition adds in another order (see test_batch.py)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, scenes) -> Path:  # noqa: F811
    """36 decodable scenes (enough for a kill to land mid-run) and four files that cannot be captioned."""
    folder = tmp_path_factory.mktemp("torchrun_inputs")
    for k in range(3):
        for p in scenes:
            (folder / f"{k}_{p.name}").write_bytes(p.read_bytes())
    (folder / "0_empty.png").write_bytes(b"")
    (folder / "1_text.jpg").write_text("not a JPEG\n")
    Image.new("RGB", (64, 48)).save(folder / "2_truncated.png")
    data = (folder / "2_truncated.png").read_bytes()
    (folder / "2_truncated.png").write_bytes(data[:len(data) // 2])
    os.symlink(folder / "missing.png", folder / "3_broken_link.png")
    return folder


BROKEN = {"0_empty.png", "1_text.jpg", "2_truncated.png", "3_broken_link.png"}


# --------------------------------------------------------------------------------------------- shard and merge

def test_shard_gives_every_item_once_in_order():
    items = [f"img{i}.png" for i in range(10)]
    for world in (1, 3, 4, 16):
        parts = [shard(items, r, world) for r in range(world)]
        assert sum(parts, []) == items
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    with pytest.raises(ValueError):
        shard(items, 2, 2)


def write_part(path: Path, items: list[str]) -> Path:
    path.write_text("".join(json.dumps({"path": p, "caption": "a"}) + "\n" for p in items))
    return path


def test_merge_parts_jsonl_and_csv(tmp_path):
    items = [f"img{i}.png" for i in range(5)]
    parts = [write_part(tmp_path / f"part{rank}.jsonl", shard(items, rank, 2)) for rank in range(2)]
    assert merge_parts(parts, tmp_path / "all.jsonl", expected=items) == 5
    assert [json.loads(x)["path"] for x in (tmp_path / "all.jsonl").read_text().splitlines()] == items
    with pytest.raises(CaptionerError, match="exactly once"):
        merge_parts(parts[:1], tmp_path / "bad.jsonl", expected=items)
    assert not (tmp_path / "bad.jsonl").exists()
    csv_parts = []
    for rank in range(2):
        path = tmp_path / f"part{rank}.csv"
        path.write_text("path,caption\n" + "".join(f"{p},a\n" for p in shard(items, rank, 2)))
        csv_parts.append(path)
    merge_parts(csv_parts, tmp_path / "all.csv", expected=items)
    lines = (tmp_path / "all.csv").read_text().splitlines()
    assert lines[0] == "path,caption" and [x.split(",")[0] for x in lines[1:]] == items


def test_merge_parts_orders_by_input_keeps_the_earlier_output_and_refuses_doubles(tmp_path):
    """Parts from runs with different process counts hold scattered images: the merge puts them in input order
    after the resumed output's records, and a record twice or a stranger is refused with the output untouched."""
    items = [f"img{i}.png" for i in range(8)]
    out = write_part(tmp_path / "out.jsonl", items[:2])  # an earlier run with --limit 2
    before = out.read_bytes()
    parts = [write_part(tmp_path / "a.jsonl", [items[6], items[3]]),  # a killed run of 3 processes ...
             write_part(tmp_path / "b.jsonl", [items[2], items[7], items[4], items[5]])]  # ... and the rerun of 2
    with pytest.raises(CaptionerError, match="twice"):
        merge_parts([*parts, write_part(tmp_path / "c.jsonl", [items[4]])], out, expected=items, base=out)
    with pytest.raises(CaptionerError, match="not among the inputs"):
        merge_parts([*parts, write_part(tmp_path / "d.jsonl", ["elsewhere.png"])], out, expected=items, base=out)
    assert out.read_bytes() == before
    assert merge_parts(parts, out, expected=items, base=out) == 8
    assert [json.loads(x)["path"] for x in out.read_text().splitlines()] == items
    assert oct(out.stat().st_mode & 0o777) == oct(0o644)


# --------------------------------------------------------------------------------------------- caption.py


@pytest.fixture(scope="module")
def one_process(folder, checkpoint, tmp_path_factory) -> list[dict]:  # noqa: F811
    out = tmp_path_factory.mktemp("one") / "out.jsonl"
    assert caption.cli([str(folder), "--checkpoint", str(checkpoint), "--output", str(out), "--workers", "0",
                        "--quiet"]) == 1
    return read_jsonl(out)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def torchrun(nproc: int, folder: Path, checkpoint: Path, out: Path, *extra: str) -> list[str]:  # noqa: F811
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            str(ROOT / "caption.py"), str(folder), "--checkpoint", str(checkpoint), "--output", str(out),
            "--workers", "0", "--quiet", *extra]


def assert_same_as_one_process(records: list[dict], one_process: list[dict]) -> None:
    assert [r["path"] for r in records] == [r["path"] for r in one_process]  # input order, each once
    names = [Path(r["path"]).name for r in records]
    assert len(set(names)) == len(names) == 36 + len(BROKEN)
    assert {n for n, r in zip(names, records) if "error" in r} == BROKEN  # every broken file once, with a reason
    for r, s in zip(records, one_process):
        assert r.get("tokens") == s.get("tokens") and r.get("error") == s.get("error"), r["path"]
        if "log_prob" in s:
            assert r["log_prob"] == pytest.approx(s["log_prob"], abs=LOG_PROB_TOL)


@pytest.mark.integration
def test_two_processes_caption_each_image_once(folder, checkpoint, one_process, tmp_path):  # noqa: F811
    out = tmp_path / "out.jsonl"
    result = subprocess.run(torchrun(2, folder, checkpoint, out, "--attention-dir", str(tmp_path / "fig")),
                            cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stderr[-3000:]  # broken files: status 1, as with one process
    assert_same_as_one_process(read_jsonl(out), one_process)
    assert not (tmp_path / "out.jsonl.parts").exists()  # merged once, parts removed
    assert len(list((tmp_path / "fig").glob("*.png"))) == 36
    for r in read_jsonl(out):
        assert "error" in r or Path(r["attention"]).is_file()


def start_and_kill_rank1(cmd: list[str], part: Path) -> None:
    """Run ``cmd`` (torchrun) until rank 1 wrote two records, then SIGKILL rank 1 and let torchrun end the rest."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None and not (part.exists() and part.read_text().count("\n") >= 2):
            time.sleep(0.005)
        victims = []
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.environ().get("RANK") == "1":
                    victims.append(child)
            except psutil.Error:
                pass
        assert victims, "the run ended before rank 1 could be killed"
        for victim in victims:
            victim.send_signal(signal.SIGKILL)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0


@pytest.mark.parametrize("rerun_nproc", [2, 1])
@pytest.mark.integration
def test_kill_one_rank_then_rerun(folder, checkpoint, one_process, tmp_path, rerun_nproc):  # noqa: F811
    out = tmp_path / "out.jsonl"
    cmd = torchrun(2, folder, checkpoint, out, "--batch-size", "1")
    start_and_kill_rank1(cmd, tmp_path / "out.jsonl.parts" / "rank00001-of00002.jsonl")
    assert not out.exists()  # nothing merged from an incomplete run
    written = sum(p.read_text().count("\n") for p in (tmp_path / "out.jsonl.parts").iterdir())
    assert 2 <= written < 40
    if rerun_nproc == 2:  # the same command
        rerun = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    else:  # one plain process finishes what the two began
        rerun = subprocess.run([sys.executable, *cmd[5:]], cwd=ROOT, env=ENV, capture_output=True, text=True,
                               timeout=600)
    assert rerun.returncode == 1, rerun.stderr[-3000:]
    assert_same_as_one_process(read_jsonl(out), one_process)
    assert not (tmp_path / "out.jsonl.parts").exists()


@pytest.mark.integration
def test_rank_and_world_size_flags_without_torchrun(folder, checkpoint, one_process, tmp_path):  # noqa: F811
    """Another launcher: two plain processes told their place with --rank/--world-size."""
    out = tmp_path / "out.jsonl"
    port = str(29500 + os.getpid() % 1000)
    env = {k: v for k, v in ENV.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    cmd = [sys.executable, str(ROOT / "caption.py"), str(folder), "--checkpoint", str(checkpoint), "--output",
           str(out), "--workers", "0", "--quiet", "--world-size", "2"]
    procs = [subprocess.Popen([*cmd, "--rank", str(r)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    codes = [p.wait(timeout=600) for p in procs]
    assert codes == [1, 1], [p.stderr.read()[-2000:] for p in procs]
    assert_same_as_one_process(read_jsonl(out), one_process)


def test_several_processes_need_an_output_file(folder, checkpoint, capsys):  # noqa: F811
    assert caption.cli([str(folder), "--checkpoint", str(checkpoint), "--rank", "0", "--world-size", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--output" in err


def test_parts_of_other_inputs_are_refused(folder, checkpoint, tmp_path, capsys, scenes):  # noqa: F811
    """Parts left by a killed run over other images: one line, nothing changed, rather than a wrong merge."""
    out = tmp_path / "out.jsonl"
    parts = tmp_path / "out.jsonl.parts"
    parts.mkdir()
    stranger = parts / "rank00000-of00002.jsonl"
    stranger.write_text(json.dumps({"path": str(scenes[0]), "caption": "a"}) + "\n")
    assert caption.cli([str(folder), "--checkpoint", str(checkpoint), "--output", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not among these inputs" in err
    assert stranger.read_text().count("\n") == 1 and not out.exists()
    shutil.rmtree(parts)


def test_an_error_every_process_meets_is_said_once(folder, checkpoint, tmp_path, capsys):  # noqa: F811
    """A foreign --output under two processes: rank 0 says it in one line, rank 1 exits 2 silently, nothing is
    changed and no parts folder is made (before: each rank printed the same line)."""
    out = tmp_path / "notes.jsonl"
    out.write_text("my notes\n")
    argv = [str(folder), "--checkpoint", str(checkpoint), "--output", str(out), "--world-size", "2", "--quiet"]
    assert caption.cli([*argv, "--rank", "1"]) == 2
    assert capsys.readouterr().err == ""
    assert caption.cli([*argv, "--rank", "0"]) == 2
    assert "left unchanged" in capsys.readouterr().err.strip()
    assert out.read_text() == "my notes\n" and not (tmp_path / "notes.jsonl.parts").exists()
