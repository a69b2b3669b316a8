"""`clharness data check|fetch` against an HTTP server on 127.0.0.1 serving fabricated archives in the
published formats: a good archive lands in the layout the loaders read, a wrong checksum leaves
nothing behind, an interrupted download resumes with a Range request. No other address is contacted."""
import dataclasses
import hashlib
import io
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from clharness.cli import main
from clharness.data import fetch as F
from clharness.data.imagefolder import CUB200, ImageFolder, TinyImageNet


def jpeg(value: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), value, dtype=np.uint8)).save(out, format="JPEG")
    return out.getvalue()


def tiny_zip() -> bytes:
    """tiny-imagenet-200.zip as published: train/<wnid>/images/, flat val/images/ + val_annotations.txt."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("tiny-imagenet-200/wnids.txt", "n01\nn02\n")
        z.writestr("tiny-imagenet-200/words.txt", "n01\tgoldfish\nn02\tsalamander\n")
        for w, v in (("n01", 40), ("n02", 200)):
            for k in range(3):
                z.writestr(f"tiny-imagenet-200/train/{w}/images/{w}_{k}.JPEG", jpeg(v))
        ann = [("val_0.JPEG", "n02"), ("val_1.JPEG", "n01"), ("val_2.JPEG", "n02")]
        for name, w in ann:
            z.writestr(f"tiny-imagenet-200/val/images/{name}", jpeg(40 if w == "n01" else 200))
        z.writestr("tiny-imagenet-200/val/val_annotations.txt", "".join(f"{n}\t{w}\t0\t0\t7\t7\n" for n, w in ann))
    return out.getvalue()


def cub_tgz() -> bytes:
    """CUB_200_2011.tgz as published: images/<NNN.Species>/ and the id tables."""
    files = {"CUB_200_2011/classes.txt": b"1 001.Albatross\n2 002.Auklet\n",
             "CUB_200_2011/images.txt": b"1 001.Albatross/a1.jpg\n2 001.Albatross/a2.jpg\n3 002.Auklet/b1.jpg\n",
             "CUB_200_2011/image_class_labels.txt": b"1 1\n2 1\n3 2\n",
             "CUB_200_2011/train_test_split.txt": b"1 1\n2 0\n3 1\n",
             "CUB_200_2011/images/001.Albatross/a1.jpg": jpeg(10), "CUB_200_2011/images/001.Albatross/a2.jpg": jpeg(20),
             "CUB_200_2011/images/002.Auklet/b1.jpg": jpeg(30), "attributes.txt": b"1 has_bill_shape::curved\n"}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


class Server:
    """Serves ``files`` (name -> bytes) with HTTP Range support; ``drop_once`` names files whose first
    transfer is cut after half of the bytes. ``ranges`` records each request's Range header."""

    def __init__(self):
        self.files, self.drop_once, self.ranges = {}, set(), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                data = server.files.get(name)
                server.ranges.append((name, self.headers.get("Range")))
                if data is None:
                    self.send_error(404)
                    return
                start = int(self.headers["Range"].split("=")[1].split("-")[0]) if self.headers.get("Range") else 0
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if name in server.drop_once:
                    server.drop_once.discard(name)
                    self.wfile.write(data[start:len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data[start:])

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(monkeypatch):
    s = Server()
    s.files = {"tiny-imagenet-200.zip": tiny_zip(), "CUB_200_2011.tgz": cub_tgz()}
    for name, filename in (("tinyimagenet", "tiny-imagenet-200.zip"), ("cub200", "CUB_200_2011.tgz")):
        archive, = F.CATALOG[name].archives   # the fabricated archives' md5 stands in for the published one
        fake = dataclasses.replace(archive, md5=hashlib.md5(s.files[filename]).hexdigest())
        monkeypatch.setitem(F.CATALOG, name, dataclasses.replace(F.CATALOG[name], archives=(fake,)))
    monkeypatch.setenv(F.MIRROR_ENV, s.url)   # never the published hosts
    yield s
    s.close()


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".part" in p.name or ".unpacking" in str(p)
                  or p.suffix in (".zip", ".tgz"))


def test_tinyimagenet_lands_where_both_loaders_read_it(server, tmp_path):
    assert main(["data", "fetch", "tinyimagenet", "--root", str(tmp_path)]) == 0
    base = tmp_path / "tiny-imagenet-200"
    # val sorted into class folders by val_annotations.txt
    assert sorted(p.relative_to(base).as_posix() for p in (base / "test").rglob("*.JPEG")) == \
        ["test/n01/val_1.JPEG", "test/n02/val_0.JPEG", "test/n02/val_2.JPEG"]
    val = TinyImageNet().load(tmp_path, train=False)
    assert val.classes == ["goldfish", "salamander"] and val.labels.tolist() == [0, 1, 1]
    tree = ImageFolder(path="tiny-imagenet-200", image_size=8)
    tree.name = "tiny"
    test = tree.load(tmp_path, train=False)
    assert test.classes == ["n01", "n02"] and sorted(test.labels.tolist()) == [0, 1, 1]
    assert leftovers(tmp_path) == []   # archive removed after unpacking, no .part, no staging folder


def test_cub_lands_with_its_split_class_folders(server, tmp_path):
    assert F.fetch(["cub200"], tmp_path) == [f"cub200: {tmp_path / 'CUB_200_2011'}"]
    base = tmp_path / "CUB_200_2011"
    assert sorted(p.relative_to(base / "split").as_posix() for p in (base / "split").rglob("*.jpg")) == \
        ["test/001.Albatross/a2.jpg", "train/001.Albatross/a1.jpg", "train/002.Auklet/b1.jpg"]
    train = CUB200().load(tmp_path, train=True)
    assert train.classes == ["Albatross", "Auklet"] and len(train) == 2
    assert leftovers(tmp_path) == []


def test_a_wrong_checksum_is_an_error_and_leaves_no_file(server, tmp_path, capsys):
    server.files["CUB_200_2011.tgz"] = server.files["CUB_200_2011.tgz"][:-10] + b"0123456789"   # tampered
    assert main(["data", "fetch", "cub200", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "CUB_200_2011.tgz" in err and "does not match the published" in err and "was deleted" in err
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    assert not (tmp_path / "CUB_200_2011").exists()


def test_a_dropped_connection_resumes_with_a_range_request(server, tmp_path):
    size = len(server.files["tiny-imagenet-200.zip"])
    server.drop_once.add("tiny-imagenet-200.zip")
    F.fetch(["tinyimagenet"], tmp_path)
    assert server.ranges == [("tiny-imagenet-200.zip", None), ("tiny-imagenet-200.zip", f"bytes={size // 2}-")]
    assert TinyImageNet().load(tmp_path, train=True).labels.tolist() == [0, 0, 0, 1, 1, 1]


def test_an_interrupted_fetch_resumes_in_the_next_command(server, tmp_path):
    size = len(server.files["tiny-imagenet-200.zip"])
    archive, = F.CATALOG["tinyimagenet"].archives
    server.drop_once.add("tiny-imagenet-200.zip")
    with pytest.raises(F.FetchError, match="run the same command again to resume"):
        F.download(f"{server.url}/tiny-imagenet-200.zip", tmp_path / "t.zip", archive.md5, attempts=1)
    assert (tmp_path / "t.zip.part").stat().st_size == size // 2
    F.download(f"{server.url}/tiny-imagenet-200.zip", tmp_path / "t.zip", archive.md5, attempts=1)
    assert server.ranges[-1] == ("tiny-imagenet-200.zip", f"bytes={size // 2}-")
    assert (tmp_path / "t.zip").read_bytes() == server.files["tiny-imagenet-200.zip"]
    assert not (tmp_path / "t.zip.part").exists()


def test_licensed_datasets_get_instructions_not_downloads(server, tmp_path, capsys):
    assert main(["data", "fetch", "imagenet", "kaggle", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "imagenet: not downloaded: needs an image-net.org account" in out and "kaggle datasets download" in out
    assert server.ranges == [] and list(tmp_path.iterdir()) == []
    assert main(["data", "fetch", "imagenet-z", "--root", str(tmp_path)]) == 1
    assert "unknown dataset(s) ['imagenet-z']" in capsys.readouterr().err


def test_check_lists_each_dataset_and_its_command_then_passes_after_fetch(server, tmp_path, capsys):
    suite = tmp_path / "s.toml"
    suite.write_text('[suite]\nname = "s"\nmethods = ["finetune"]\n[defaults]\nbackbone = "mlp"\n'
                     '[[scenario]]\nname = "a"\ndataset = "tinyimagenet"\nsetting = "class-incremental"\ntasks = 2\n'
                     '[[scenario]]\nname = "b"\ndataset = "digits"\nsetting = "class-incremental"\ntasks = 2\n')
    root = tmp_path / "data"
    assert main(["data", "check", "--suite", str(suite), "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"missing: {root / 'tiny-imagenet-200' / 'wnids.txt'}" in out
    assert f"clharness data fetch tinyimagenet --root {root}" in out and "present (no files needed)" in out
    assert main(["data", "fetch", "tinyimagenet", "--root", str(root)]) == 0
    assert main(["data", "check", "--suite", str(suite), "--root", str(root)]) == 0
    tiny_line, = [line for line in capsys.readouterr().out.splitlines() if line.startswith("tinyimagenet ")]
    assert tiny_line.split()[1:] == ["present", "-"]


def test_torchvision_datasets_are_fetched_by_torchvision_both_splits(monkeypatch, tmp_path):
    from clharness.data.torchvision_sources import CIFAR10
    calls = []
    monkeypatch.setattr(CIFAR10, "load", lambda self, root, train, download=False: calls.append((root, train, download)))
    assert F.fetch(["cifar10"], tmp_path) == [f"cifar10: fetched by torchvision into {tmp_path}"]
    assert calls == [(tmp_path, True, True), (tmp_path, False, True)]


def test_suite_datasets_reads_every_dataset_reference():
    from clharness.builtin import suite_dir
    assert F.suite_datasets(suite_dir() / "gtep-cifar50.toml") == [
        ("cifar100", {}), ("imagefolder", {"path": "imagenet"})]   # read at 224x224 for ResNet-18 (issue 30 item 3)
    from clharness.benchmarks.cldyb.pool import POOL_DATASETS   # table 1's pool is CLDyB-pool (issue 30 item 8)
    assert F.suite_datasets(suite_dir() / "cldyb-cc.toml") == [
        *(("cldyb-pool", {"folder": f, "min_images": 45}) for f in POOL_DATASETS), ("imagefolder", {"path": "cldyb-heldout"})]
