"""torchvision-backed sources on tiny files written in each real on-disk format."""
import numpy as np
import pytest
import torch
import torchvision.datasets as tvd

import fakedata
from clharness.data import BUILTIN_SOURCES, DatasetMissing, load_split
from clharness.data.torchvision_sources import FashionMNIST


def make(name, **options):
    source = BUILTIN_SOURCES[name](**options)
    source.name = name
    return source


def check_arrays(ds, images, labels, classes):
    assert ds.images.dtype == torch.uint8 and ds.labels.dtype == torch.int64
    assert ds.images.shape == images.shape
    assert torch.equal(ds.images, torch.from_numpy(images))
    assert ds.labels.tolist() == labels.tolist()
    assert ds.classes == classes


@pytest.mark.parametrize("name,tv,writer", [
    ("mnist", tvd.MNIST, fakedata.write_mnist),
    ("fashion-mnist", tvd.FashionMNIST, fakedata.write_fashion_mnist),
    ("kmnist", tvd.KMNIST, fakedata.write_kmnist),
])
def test_mnist_family_round_trip(tmp_path, name, tv, writer):
    data = writer(tmp_path, n_per_class=3)
    for train, split in ((True, "train"), (False, "test")):
        ds = make(name).load(tmp_path, train)
        check_arrays(ds, *data[split], list(tv.classes))
        assert ds.input_shape == (1, 28, 28) and ds.name == name
    assert len(make(name).load(tmp_path, True)) == 30 and len(make(name).load(tmp_path, False)) == 10


@pytest.mark.parametrize("split,k", [("balanced", 47), ("letters", 26), ("digits", 10)])
def test_emnist_transposes_and_shifts_letters(tmp_path, split, k):
    data = fakedata.write_emnist(tmp_path, split=split, n_per_class=1)
    ds = make("emnist", split=split).load(tmp_path, True)
    check_arrays(ds, *data["train"], ds.classes)   # images come back upright (the files hold them transposed)
    assert len(ds.classes) == k and ds.labels.max().item() == k - 1 and ds.labels.min().item() == 0
    if split == "letters":
        assert ds.classes[:3] == ["a", "b", "c"]   # torchvision's empty "N/A" class 0 is dropped
    if split == "balanced":
        assert ds.classes[:11] == list("0123456789A") and ds.classes[-1] == "t"
    assert len(make("emnist", split=split).load(tmp_path, False)) == k


def test_emnist_rejects_unknown_split():
    with pytest.raises(ValueError, match="split must be one of"):
        make("emnist", split="nope")


def test_cifar10_round_trip(tmp_path):
    data = fakedata.write_cifar10(tmp_path, n_per_class=2)
    train, test = make("cifar10").load(tmp_path, True), make("cifar10").load(tmp_path, False)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    check_arrays(train, *data["train"], names)   # from batches.meta
    check_arrays(test, *data["test"], names)
    assert len(train) == 20 and len(test) == 10
    assert train.input_shape == (3, 32, 32)


def test_cifar100_round_trip(tmp_path):
    data = fakedata.write_cifar100(tmp_path, n_per_class=1)
    train, test = make("cifar100").load(tmp_path, True), make("cifar100").load(tmp_path, False)
    names = [f"fine{i:02d}" for i in range(100)]
    check_arrays(train, *data["train"], names)      # fine labels, not coarse
    check_arrays(test, *data["test"], names)


def test_svhn_maps_label_10_to_digit_0(tmp_path):
    data = fakedata.write_svhn(tmp_path, n_per_class=2)
    train, test = make("svhn").load(tmp_path, True), make("svhn").load(tmp_path, False)
    check_arrays(train, *data["train"], [str(d) for d in range(10)])
    check_arrays(test, *data["test"], [str(d) for d in range(10)])
    assert 0 in train.labels.tolist() and train.input_shape == (3, 32, 32)


def test_svhn_also_found_directly_in_root(tmp_path):
    data = fakedata.write_svhn(tmp_path, n_per_class=1, folder="")   # where torchvision's SVHN(root) puts it
    check_arrays(make("svhn").load(tmp_path, False), *data["test"], [str(d) for d in range(10)])


def test_omniglot_split_per_character_and_inverted(tmp_path):
    written = fakedata.write_omniglot(tmp_path, alphabets=("Latin", "Greek"), characters=2, drawings=20)
    train, test = make("omniglot").load(tmp_path, True), make("omniglot").load(tmp_path, False)
    classes = ["Greek/character01", "Greek/character02", "Latin/character01", "Latin/character02"]
    assert train.classes == classes == test.classes
    assert train.images.shape == (60, 1, 105, 105) and test.images.shape == (20, 1, 105, 105)
    assert train.labels.bincount().tolist() == [15] * 4 and test.labels.bincount().tolist() == [5] * 4
    # Sorted drawings: the first 15 train, the rest test. Strokes come back bright (255) on black.
    masks = [m for (c, f), m in sorted(written.items()) if c == "Latin/character02"]
    assert torch.equal(train.images[train.labels == 3][0, 0], torch.from_numpy(masks[0].astype(np.uint8) * 255))
    assert torch.equal(test.images[test.labels == 3][-1, 0], torch.from_numpy(masks[-1].astype(np.uint8) * 255))
    raw = make("omniglot", invert=False, train_per_class=18).load(tmp_path, False)
    assert len(raw) == 8 and torch.equal(raw.images[-1, 0], torch.from_numpy((~masks[-1]).astype(np.uint8) * 255))


def test_omniglot_evaluation_set(tmp_path):
    fakedata.write_omniglot(tmp_path, alphabets=("Atlantean",), characters=1, drawings=20, background=False)
    assert len(make("omniglot", background=False).load(tmp_path, True)) == 15
    with pytest.raises(DatasetMissing, match="images_background"):
        make("omniglot").load(tmp_path, True)


@pytest.mark.parametrize("name,options,expected", [
    ("mnist", {}, "MNIST/raw/train-images-idx3-ubyte"),
    ("fashion-mnist", {}, "FashionMNIST/raw/train-images-idx3-ubyte"),
    ("kmnist", {}, "KMNIST/raw/train-images-idx3-ubyte"),
    ("emnist", {"split": "letters"}, "EMNIST/raw/emnist-letters-train-images-idx3-ubyte"),
    ("cifar10", {}, "cifar-10-batches-py/data_batch_1"),
    ("cifar100", {}, "cifar-100-python/train"),
    ("svhn", {}, "svhn/train_32x32.mat"),
    ("omniglot", {}, "omniglot-py/images_background"),
])
def test_missing_dataset_names_path_layout_and_flags(tmp_path, monkeypatch, name, options, expected):
    # a system copy (Debian's dataset-fashion-mnist on this machine) would be found: look in an empty one
    monkeypatch.setattr(FashionMNIST, "system_folders", (str(tmp_path / "no-system-copy"),))
    source = make(name, **options)
    with pytest.raises(DatasetMissing) as err:
        source.load(tmp_path, True)
    message = str(err.value)
    assert str(tmp_path / expected) in message
    assert source.layout in message and "--clh-data-root" in message and "--clh-download" in message
    assert "corrupted" not in message
    with pytest.raises(DatasetMissing, match="no data root was given"):
        load_split(source, None, True)


def test_partial_files_name_the_first_missing_one(tmp_path):
    fakedata.write_cifar10(tmp_path, n_per_class=1)
    (tmp_path / "cifar-10-batches-py" / "batches.meta").unlink()
    with pytest.raises(DatasetMissing, match="batches.meta"):
        make("cifar10").load(tmp_path, True)
    fakedata.write_mnist(tmp_path, n_per_class=1)
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DatasetMissing, match="t10k-labels-idx1-ubyte"):
        make("mnist").load(tmp_path, False)


def test_load_split_caches_and_identity(tmp_path):
    fakedata.write_mnist(tmp_path, n_per_class=1)
    source = make("mnist")
    assert load_split(source, tmp_path, True) is load_split(source, str(tmp_path), True)
    assert make("emnist").identity() == "emnist(split=balanced)"
    assert all(BUILTIN_SOURCES[n].describe() for n in BUILTIN_SOURCES)


@pytest.mark.parametrize("name,tv,expected", [
    ("mnist", tvd.MNIST, "MNIST/raw/train-images-idx3-ubyte"),
    ("cifar10", tvd.CIFAR10, "cifar-10-batches-py/data_batch_1"),
    ("svhn", tvd.SVHN, "svhn/train_32x32.mat"),
    ("omniglot", tvd.Omniglot, "omniglot-py/images_background"),
])
def test_torchvision_not_found_error_becomes_dataset_missing(tmp_path, monkeypatch, name, tv, expected):
    # With download the files are checked by torchvision itself; stub the fetch (no network in tests)
    # so torchvision raises its generic "Dataset not found" error, which must not escape.
    monkeypatch.setattr(tv, "download", lambda self: None)
    with pytest.raises(DatasetMissing, match="Expected layout") as err:
        make(name).load(tmp_path, True, download=True)
    assert str(tmp_path / expected) in str(err.value) and isinstance(err.value.__cause__, RuntimeError)
