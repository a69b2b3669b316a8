"""The MNIST family's copies: the data root, then a system package's folder (Debian's
dataset-fashion-mnist), each file raw or as the published .gz, read in place (nothing written beside
a read-only folder); `clharness data check` and `fetch` say which copy a run reads. Every file here is
written by the test in the real IDX format."""
import gzip
import os
import shutil
import stat

import numpy as np
import pytest
import torch

import fakedata
from clharness.cli import main
from clharness.data import DatasetMissing, load_split
from clharness.data import fetch as F
from clharness.data.torchvision_sources import MNIST, FashionMNIST, read_idx

FILES = MNIST.FILES


def gzip_folder(src, dst, keep=()):
    """``dst`` holding each IDX file of ``src`` as NAME.gz (names in ``keep`` stay raw)."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if name in keep:
            shutil.copy(src / name, dst / name)
        else:
            with gzip.open(dst / f"{name}.gz", "wb") as out:
                out.write((src / name).read_bytes())
    return dst


def source(cls, name):
    s = cls()
    s.name = name
    return s


@pytest.fixture
def system(tmp_path, monkeypatch):
    """A fabricated system folder of gzip files only (seed 7), read-only as /usr/share is."""
    made = tmp_path / "made"
    data = fakedata.write_fashion_mnist(made, n_per_class=2, seed=7)
    folder = gzip_folder(made / "FashionMNIST" / "raw", tmp_path / "usr-share" / "fashion-mnist")
    for p in folder.iterdir():
        p.chmod(stat.S_IRUSR)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    monkeypatch.setattr(FashionMNIST, "system_folders", (str(folder),))
    yield folder, data
    folder.chmod(stat.S_IRWXU)


def test_read_idx_gzip_equals_raw_and_known_bytes(tmp_path):
    # a 2x2x3 image file by hand: header 00 00 08 03, dims 2 2 3, then 12 bytes 0..11
    raw = tmp_path / "x-idx3-ubyte"
    raw.write_bytes(bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3]) + bytes(range(12)))
    with gzip.open(tmp_path / "x-idx3-ubyte.gz", "wb") as out:
        out.write(raw.read_bytes())
    expected = torch.arange(12, dtype=torch.uint8).view(2, 2, 3)
    assert torch.equal(read_idx(raw), expected)
    assert torch.equal(read_idx(tmp_path / "x-idx3-ubyte.gz"), expected)
    raw.write_bytes(raw.read_bytes()[:-1])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(raw)
    raw.write_bytes(bytes([0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0, 0]))   # float IDX, not unsigned bytes
    with pytest.raises(ValueError, match="unsigned bytes"):
        read_idx(raw)


@pytest.mark.parametrize("cls,name,folder,writer", [
    (MNIST, "mnist", "MNIST", fakedata.write_mnist),
    (FashionMNIST, "fashion-mnist", "FashionMNIST", fakedata.write_fashion_mnist),
])
def test_gzip_and_raw_in_the_data_root_read_the_same(tmp_path, monkeypatch, cls, name, folder, writer):
    monkeypatch.setattr(FashionMNIST, "system_folders", ())
    data = writer(tmp_path / "raw-root", n_per_class=3)
    # the published files: all .gz, and a mix (one raw, three .gz)
    gz_root, mixed_root = tmp_path / "gz-root", tmp_path / "mixed-root"
    gzip_folder(tmp_path / "raw-root" / folder / "raw", gz_root / folder / "raw")
    gzip_folder(tmp_path / "raw-root" / folder / "raw", mixed_root / folder / "raw", keep=(FILES[0],))
    for root in (tmp_path / "raw-root", gz_root, mixed_root):
        for train, split in ((True, "train"), (False, "test")):
            ds = source(cls, name).load(root, train)
            images, labels = data[split]
            assert ds.images.dtype == torch.uint8 and torch.equal(ds.images, torch.from_numpy(images))
            assert ds.labels.tolist() == labels.tolist()


def test_system_copy_used_without_a_data_root_and_read_in_place(system):
    folder, data = system
    before = sorted(os.listdir(folder))
    ds = load_split(source(FashionMNIST, "fashion-mnist"), None, True)
    assert torch.equal(ds.images, torch.from_numpy(data["train"][0])) and ds.images.dtype == torch.uint8
    assert sorted(os.listdir(folder)) == before   # nothing unpacked beside the read-only files
    assert source(FashionMNIST, "fashion-mnist").locate(None)[0] == "system copy"


def test_data_root_comes_before_the_system_copy(tmp_path, system):
    root = tmp_path / "root"
    mine = fakedata.write_fashion_mnist(root, n_per_class=1, seed=3)   # different images from the system's
    s = source(FashionMNIST, "fashion-mnist")
    assert s.locate(root)[0] == "data root"
    assert torch.equal(s.load(root, False).images, torch.from_numpy(mine["test"][0]))
    (root / "FashionMNIST" / "raw" / FILES[3]).unlink()   # an incomplete root copy: the system one is read
    assert s.locate(root)[0] == "system copy"
    assert torch.equal(s.load(root, False).images, torch.from_numpy(system[1]["test"][0]))


def test_absent_everywhere_names_every_place_and_the_fixes(tmp_path, monkeypatch):
    monkeypatch.setattr(FashionMNIST, "system_folders", (str(tmp_path / "absent"),))
    with pytest.raises(DatasetMissing) as err:
        source(FashionMNIST, "fashion-mnist").load(tmp_path / "root", True)
    message = str(err.value)
    assert str(tmp_path / "root" / "FashionMNIST" / "raw" / FILES[0]) in message
    assert str(tmp_path / "absent") in message and "apt-get install dataset-fashion-mnist" in message
    assert "clharness data fetch fashion-mnist" in message
    with pytest.raises(DatasetMissing, match="no data root was given"):
        load_split(source(FashionMNIST, "fashion-mnist"), None, True)


def suite_file(tmp_path, dataset):
    path = tmp_path / "s.toml"
    path.write_text(f'[suite]\nname = "s"\n[[scenario]]\nname = "a"\ndataset = "{dataset}"\ntasks = 5\n')
    return path


def test_data_check_says_which_copy_a_run_reads(tmp_path, system, capsys):
    folder, _ = system
    path = suite_file(tmp_path, "fashion-mnist")
    assert main(["data", "check", "--suite", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"present: system copy {folder}" in out
    root = tmp_path / "root"
    fakedata.write_fashion_mnist(root, n_per_class=1)
    assert main(["data", "check", "--suite", str(path), "--root", str(root)]) == 0
    assert f"present: data root {root / 'FashionMNIST' / 'raw'}" in capsys.readouterr().out


def test_data_check_missing_lists_places_and_commands(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(FashionMNIST, "system_folders", (str(tmp_path / "absent"),))
    assert main(["data", "check", "--suite", str(suite_file(tmp_path, "fashion-mnist"))]) == 1
    out = capsys.readouterr().out
    assert f"missing: looked in system copy {tmp_path / 'absent'}" in out
    assert "clharness data fetch fashion-mnist --root DIR (or apt-get install dataset-fashion-mnist)" in out


def test_fetch_downloads_nothing_when_a_copy_is_there(tmp_path, system, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("fetch must not download a dataset a run already finds")
    monkeypatch.setattr(FashionMNIST.tv_class, "download", no_network)
    lines = F.fetch(["fashion-mnist"], tmp_path / "root")
    assert lines == [f"fashion-mnist: already present (system copy {system[0]}), nothing fetched"]


def test_fetch_verifies_torchvision_checksums(tmp_path, monkeypatch):
    """With no copy, fetch goes through torchvision's download, which checks each file's md5: a served
    file with another checksum is refused (torchvision's own check, served from this process)."""
    import torchvision.datasets.mnist as tvm
    monkeypatch.setattr(FashionMNIST, "system_folders", ())
    calls = []

    def fake_download_and_extract(url, download_root, filename, md5):
        calls.append((filename, md5))
        raise RuntimeError(f"File not found or corrupted: {filename} md5 mismatch")
    monkeypatch.setattr(tvm, "download_and_extract_archive", fake_download_and_extract)
    with pytest.raises(F.FetchError, match="(?s)fashion-mnist: torchvision could not fetch.*md5 mismatch"):
        F.fetch(["fashion-mnist"], tmp_path / "root")
    published = dict(FashionMNIST.tv_class.resources)
    assert calls and calls[0] == ("train-images-idx3-ubyte.gz", published["train-images-idx3-ubyte.gz"])
