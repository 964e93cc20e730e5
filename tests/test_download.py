"""The dataset downloader against a local HTTP server: real archive layouts in miniature, a connection dropped
midway (resumed with a Range request), a .part left by an earlier run, a corrupt archive, a split archive."""

import dataclasses
import hashlib
import io
import json
import random
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from captioner.commands.download import cli as download_cli
from captioner.data import sources as dl
from captioner.data.karpathy import KarpathySplit, load_karpathy_json


class FileServer:
    """Serves ``files`` (name -> bytes) on 127.0.0.1 with Range support; names in ``drop_once`` send their headers
    and half of their body on the first GET, then close the connection."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.drop_once: set[str] = set()
        self.requests: list[tuple[str, str | None]] = []  # (name, Range header)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                server.requests.append((name, self.headers.get("Range")))
                data = server.files.get(name)
                if data is None:
                    self.send_error(404)
                    return
                start, status = 0, 200
                if self.headers.get("Range"):
                    start = int(self.headers["Range"].removeprefix("bytes=").split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.end_headers()
                        return
                    status = 206
                self.send_response(status)
                self.send_header("Content-Length", str(len(data) - start))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                body = data[start:]
                if name in server.drop_once:
                    server.drop_once.discard(name)
                    self.wfile.write(body[:len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def ranges(self, name):
        return [r for n, r in self.requests if n == name]


@pytest.fixture
def server():
    s = FileServer()
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def _jpeg(seed):
    rng = random.Random(seed)
    im = Image.frombytes("RGB", (48, 40), bytes(rng.randrange(256) for _ in range(48 * 40 * 3)))
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _karpathy(records):
    return json.dumps({"images": [{"filepath": fp, "filename": fn, "imgid": i, "split": split,
                                   "sentences": [{"raw": f"a photo number {i}", "tokens": ["a", "photo"]}]}
                                  for i, (fp, fn, split) in enumerate(records)]}).encode()


FLICKR = [f"{1000 + i}_abc.jpg" for i in range(4)]
SPLITS = ["train", "train", "val", "test"]


def _caption_datasets(coco_records=()):
    """caption_datasets.zip as Karpathy ships it: the three JSON files at its top level."""
    flickr = _karpathy([("", n, s) for n, s in zip(FLICKR, SPLITS)])
    return _zip({"dataset_flickr8k.json": flickr, "dataset_flickr30k.json": flickr,
                 "dataset_coco.json": _karpathy(coco_records)})


def _flickr8k_zip():
    members = {f"Flicker8k_Dataset/{n}": _jpeg(i) for i, n in enumerate(FLICKR)}
    members["__MACOSX/Flicker8k_Dataset/._1000_abc.jpg"] = b"mac metadata"
    return _zip(members)


def _run(server, tmp_path, name, *extra):
    argv = [name, "--to", str(tmp_path / "data"), "--out", str(tmp_path / "datasets"), "--base-url", server.url,
            "--retry-wait", "0", "--no-progress", *extra]
    return download_cli(argv)


def test_flickr8k_end_to_end_resumes_a_dropped_connection(server, tmp_path, capsys):
    server.files = {"Flickr8k_Dataset.zip": _flickr8k_zip(), "caption_datasets.zip": _caption_datasets()}
    server.drop_once = {"Flickr8k_Dataset.zip"}
    assert _run(server, tmp_path, "flickr8k") == 0, capsys.readouterr().err
    # the first GET got half the archive; the retry asked for the rest only
    size = len(server.files["Flickr8k_Dataset.zip"])
    first, second = server.ranges("Flickr8k_Dataset.zip")
    assert first is None and second == f"bytes={size // 2}-"
    out = tmp_path / "datasets" / "flickr8k" / "dataset_flickr8k.json"
    assert len(load_karpathy_json(out)) == 4
    train = KarpathySplit.load(out, "train")
    assert [p.name for p in train.image_paths] == FLICKR[:2]
    assert train.image_paths[0].resolve().parent == (tmp_path / "data" / "flickr8k" / "Flicker8k_Dataset").resolve()
    assert not (tmp_path / "data" / "flickr8k" / "__MACOSX").exists()
    assert not list((tmp_path / "data" / "downloads").iterdir())  # archives removed after unpacking
    assert "terms of use" in capsys.readouterr().out
    # a second run downloads nothing again
    n = len(server.requests)
    assert _run(server, tmp_path, "flickr8k") == 0
    assert len(server.requests) == n


def test_part_left_by_an_interrupted_run_is_resumed(server, tmp_path, capsys):
    data = _flickr8k_zip()
    server.files = {"Flickr8k_Dataset.zip": data, "caption_datasets.zip": _caption_datasets()}
    server.drop_once = {"Flickr8k_Dataset.zip"}
    assert _run(server, tmp_path, "flickr8k", "--retries", "0") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("captioner.data.download: error: cannot download") and "run the same command" in err
    part = tmp_path / "data" / "downloads" / "Flickr8k_Dataset.zip.part"
    assert part.stat().st_size == len(data) // 2
    assert _run(server, tmp_path, "flickr8k", "--retries", "0") == 0
    assert server.ranges("Flickr8k_Dataset.zip")[-1] == f"bytes={len(data) // 2}-"
    assert len(load_karpathy_json(tmp_path / "datasets" / "flickr8k" / "dataset_flickr8k.json")) == 4


def _coco_files():
    train = {f"train2014/COCO_train2014_{i:012d}.jpg": _jpeg(i) for i in (9, 25)}
    val = {f"val2014/COCO_val2014_{i:012d}.jpg": _jpeg(i) for i in (42, 73, 74)}
    records = [(p.split("/")[0], p.split("/")[1], s) for p, s in
               zip(list(train) + list(val), ["train", "train", "restval", "val", "test"])]
    return _zip(train), _zip(val), _caption_datasets(records)


def test_coco_corrupt_archive_is_detected_by_its_checksum_and_not_used(server, tmp_path, capsys, monkeypatch):
    train, val, captions = _coco_files()
    coco = dl.SOURCES["coco"]
    archives = tuple(dataclasses.replace(a, md5=hashlib.md5(train if a.filename == "train2014.zip" else val)
                                         .hexdigest()) if a is not dl.KARPATHY else a for a in coco.archives)
    monkeypatch.setitem(dl.SOURCES, "coco", dataclasses.replace(coco, archives=archives))
    corrupt = bytearray(train)
    corrupt[len(corrupt) // 3] ^= 0xFF
    server.files = {"train2014.zip": bytes(corrupt), "val2014.zip": val, "caption_datasets.zip": captions}
    assert _run(server, tmp_path, "coco") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train2014.zip is corrupt: its MD5 is" in err
    assert not (tmp_path / "data" / "coco" / "train2014").exists()  # the bad file was not unpacked
    assert (tmp_path / "data" / "downloads" / "train2014.zip.bad").is_file()
    assert not (tmp_path / "datasets" / "coco").exists()
    server.files["train2014.zip"] = train  # the mirror is fixed: a rerun fetches it afresh
    assert _run(server, tmp_path, "coco") == 0, capsys.readouterr().err
    out = tmp_path / "datasets" / "coco" / "dataset_coco.json"
    assert sorted(r["filepath"].rsplit("/", 1)[-1] for r in load_karpathy_json(out)) == \
        ["train2014", "train2014", "val2014", "val2014", "val2014"]
    assert len(KarpathySplit.load(out, "train")) == 3  # train + restval


def test_zip_with_a_damaged_member_is_refused_without_a_checksum(server, tmp_path, capsys):
    data = bytearray(_flickr8k_zip())
    first_jpeg = data.find(b"\xff\xd8\xff")  # inside the first stored member
    data[first_jpeg + 200] ^= 0xFF
    server.files = {"Flickr8k_Dataset.zip": bytes(data), "caption_datasets.zip": _caption_datasets()}
    assert _run(server, tmp_path, "flickr8k") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fails its CRC check" in err
    assert not (tmp_path / "datasets" / "flickr8k").exists()


def test_flickr30k_parts_are_joined(server, tmp_path, capsys):
    whole = _zip({f"flickr30k_images/{n}": _jpeg(i) for i, n in enumerate(FLICKR)})
    third = len(whole) // 3
    server.files = {"flickr30k_part00": whole[:third], "flickr30k_part01": whole[third:2 * third],
                    "flickr30k_part02": whole[2 * third:], "caption_datasets.zip": _caption_datasets()}
    assert _run(server, tmp_path, "flickr30k") == 0, capsys.readouterr().err
    out = tmp_path / "datasets" / "flickr30k" / "dataset_flickr30k.json"
    assert KarpathySplit.load(out, "test").image_paths[0].parent.name == "flickr30k_images"


def test_missing_file_on_the_server_is_one_line(server, tmp_path, capsys):
    server.files = {"caption_datasets.zip": _caption_datasets()}
    assert _run(server, tmp_path, "flickr8k") == 2
    err = capsys.readouterr().err.strip()
    assert err == f"captioner.data.download: error: cannot download {server.url}/Flickr8k_Dataset.zip: " \
                  "HTTP 404 Not Found."


def test_catalogue_points_at_the_public_archives():
    assert dl.SOURCES["coco"].archives[0].urls == ("http://images.cocodataset.org/zips/train2014.zip",)
    assert all(s.archives[-1] is dl.KARPATHY for s in dl.SOURCES.values())
    assert dl._url("https://github.com/x/y/releases/download/v1/flickr30k_part01", "http://127.0.0.1:9/m/") == \
        "http://127.0.0.1:9/m/flickr30k_part01"


def test_whole_part_file_is_kept_when_the_server_has_nothing_more(server, tmp_path):
    data = _flickr8k_zip()
    server.files = {"Flickr8k_Dataset.zip": data}
    dest = tmp_path / "Flickr8k_Dataset.zip"
    (tmp_path / "Flickr8k_Dataset.zip.part").write_bytes(data)  # a run stopped after the last byte
    assert dl.fetch(f"{server.url}/Flickr8k_Dataset.zip", dest, progress=False).read_bytes() == data
    assert server.ranges("Flickr8k_Dataset.zip") == [f"bytes={len(data)}-"]
    (tmp_path / "Flickr8k_Dataset.zip.part").write_bytes(data + b"junk")  # longer than the file: fetched afresh
    dest.unlink()
    assert dl.fetch(f"{server.url}/Flickr8k_Dataset.zip", dest, progress=False).read_bytes() == data
