"""``clharness data check|fetch``: which datasets a suite needs, and getting them into our layout.

torchvision's datasets are fetched by torchvision itself (its URLs and md5 sums). TinyImageNet,
ImageNet-R, ImageNet-A and CUB-200-2011 come from their published archives: downloaded to
``<root>/.downloads/NAME.part`` (resumed with an HTTP Range request after an interruption, in this
call or the next), checked against the published md5, unpacked beside the data root and moved into
place in one rename, so a crash never leaves a half tree where a loader looks. A wrong checksum
deletes the partial file. ImageNet and the CLDyB pool's Kaggle sources need an account or a
licence: they are listed with instructions, never downloaded. ``CLH_DATA_MIRROR`` (or
``base_url=``) replaces the archives' host: ``<mirror>/<archive file name>``.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

MIRROR_ENV = "CLH_DATA_MIRROR"


class FetchError(RuntimeError):
    """A dataset that could not be fetched: the message names it, the cause and the fix."""


@dataclass(frozen=True)
class Archive:
    url: str
    md5: str
    folder: str                                   # the top folder the archive unpacks to
    convert: Callable[[Path], None] | None = None  # builds our layout inside the unpacked folder

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)   # no second copy of the images
    except OSError:
        shutil.copy2(src, dst)


def convert_tinyimagenet(base: Path) -> None:
    """The zip's val/ is one flat folder labelled by val/val_annotations.txt (file, wnid, box). The
    tinyimagenet source reads it as it is; this also sorts it into test/<wnid>/ (hard links), so the
    folder reads as a plain ImageFolder tree too (train/<wnid>/images/*.JPEG, test/<wnid>/*.JPEG)."""
    ann = base / "val" / "val_annotations.txt"
    if not ann.is_file():
        raise FetchError(f"tinyimagenet: {ann} is missing from the archive; delete {base} and fetch again")
    for line in ann.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) < 2:
            continue
        image = base / "val" / "images" / parts[0]
        if not image.is_file():
            raise FetchError(f"tinyimagenet: {image} is listed in {ann} but not in the archive")
        _link(image, base / "test" / parts[1] / parts[0])


def convert_cub(base: Path) -> None:
    """CUB's images/ holds one folder per class (NNN.Species); train_test_split.txt says which image is
    which split. The cub200 source reads that; this also writes split/{train,test}/<NNN.Species>/
    (hard links), the class-folder tree an ImageFolder reads with the official split."""
    tables = {}
    for name in ("images", "train_test_split"):
        path = base / f"{name}.txt"
        if not path.is_file():
            raise FetchError(f"cub200: {path} is missing from the archive; delete {base} and fetch again")
        tables[name] = dict(line.split(maxsplit=1) for line in path.read_text().splitlines() if line.strip())
    for image_id, rel in tables["images"].items():
        split = "train" if tables["train_test_split"][image_id].strip() == "1" else "test"
        _link(base / "images" / rel.strip(), base / "split" / split / rel.strip())


@dataclass(frozen=True)
class Entry:
    """How one dataset is had: ``torchvision`` (a registered source that downloads itself),
    ``archive`` (published archives), ``manual`` (instructions only) or ``bundled`` (no files)."""
    how: str
    archives: tuple[Archive, ...] = ()
    instructions: str = ""
    source: str = ""      # registered dataset name (torchvision entries)
    options: dict = field(default_factory=dict)


TORCHVISION = ("mnist", "fashion-mnist", "kmnist", "emnist", "cifar10", "cifar100", "svhn", "omniglot")
_HENDRYCKS = "https://people.eecs.berkeley.edu/~hendrycks"

CATALOG: dict[str, Entry] = {
    **{name: Entry("torchvision", source=name) for name in TORCHVISION},
    "tinyimagenet": Entry("archive", (Archive("http://cs231n.stanford.edu/tiny-imagenet-200.zip",
                                              "90528d7ca1a48142e341f4ef8d21d0de", "tiny-imagenet-200",
                                              convert_tinyimagenet),)),
    "imagenet-r": Entry("archive", (Archive(f"{_HENDRYCKS}/imagenet-r.tar", "a61312130a589d0ca1a8fca1f2bd3337",
                                            "imagenet-r"),)),
    "imagenet-a": Entry("archive", (Archive(f"{_HENDRYCKS}/imagenet-a.tar", "c3e55429088dc681f30d81f4726b6595",
                                            "imagenet-a"),)),
    "cub200": Entry("archive", (Archive("https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz",
                                        "97eceeb196236b17998738112f37df78", "CUB_200_2011", convert_cub),)),
    "imagenet": Entry("manual", instructions=(
        "needs an image-net.org account and acceptance of the ILSVRC-2012 terms: download "
        "ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar there, then arrange <root>/imagenet/train/<wnid>/"
        "*.JPEG and <root>/imagenet/val/<wnid>/*.JPEG (the val images sorted into class folders by the devkit's "
        "labels)")),
    "kaggle": Entry("manual", instructions=(
        "an image tree you provide: <root>/<path>/<class>/*.jpg (or train/ and test/ class folders). The CLDyB "
        "pool's Kaggle sources need a Kaggle account and acceptance of each dataset's licence: "
        "`kaggle datasets download OWNER/NAME`, then unpack it there")),
    "digits": Entry("bundled", instructions="bundled with scikit-learn, nothing to fetch"),
    "synthetic": Entry("bundled", instructions="generated, nothing to fetch"),
}


def entry_for(dataset: str, options: dict) -> tuple[str, Entry]:
    """The catalog key and entry of a suite's dataset reference (an imagefolder is keyed by its path)."""
    if dataset == "imagefolder":
        key = str(options.get("path", "")).strip("/") or "imagefolder"
        return key, CATALOG.get(key, CATALOG["kaggle"] if key != "imagenet" else CATALOG["imagenet"])
    return dataset, CATALOG.get(dataset, Entry("manual", instructions="a plugin's dataset: see that plugin's "
                                                                      "documentation"))


# ------------------------------------------------------------------------------------ download
def _tty(stream) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


def _progress(label: str, done: int, total: int | None, started: float, stream) -> None:
    """One updating line on a terminal; nothing in logs (the caller prints the result)."""
    if not _tty(stream):
        return
    rate = done / max(time.monotonic() - started, 1e-6) / 2**20
    if total:
        width = 30
        bar = "#" * int(width * done / total)
        stream.write(f"\r{label} [{bar:<{width}}] {done / 2**20:.1f}/{total / 2**20:.1f} MiB {rate:.1f} MiB/s")
    else:
        stream.write(f"\r{label} {done / 2**20:.1f} MiB {rate:.1f} MiB/s")
    stream.flush()


def md5_of(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(url: str, dest: Path, md5: str, attempts: int = 3, stream=sys.stderr, timeout: float = 60) -> Path:
    """Fetch ``url`` to ``dest`` through ``dest.part``: an interrupted transfer resumes from the bytes
    already there (HTTP Range; from scratch if the server ignores it). The finished file must match
    ``md5``; if not, the partial file is deleted and FetchError raised."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, attempts + 1):
        have = part.stat().st_size if part.exists() else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                if have and response.status != 206:   # the server sent the whole file again
                    have = 0
                length = response.headers.get("Content-Length")
                total = have + int(length) if length else None
                started, done = time.monotonic(), have
                with open(part, "ab" if have else "wb") as out:
                    for block in iter(lambda: response.read(1 << 16), b""):
                        out.write(block)
                        done += len(block)
                        _progress(dest.name, done, total, started, stream)
                if total is not None and done < total:
                    raise urllib.error.URLError(f"connection closed after {done} of {total} bytes")
            break
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and have:   # Range past the end: the .part is already whole (or junk)
                break
            raise FetchError(f"{url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:   # dropped, reset, timed out
            if attempt == attempts:
                raise FetchError(f"{url}: {exc}; {part} keeps the {part.stat().st_size if part.exists() else 0} "
                                 "bytes received: run the same command again to resume") from None
            if _tty(stream):
                stream.write(f"\n{dest.name}: {exc}; resuming\n")
    if _tty(stream):
        stream.write("\n")
    got = md5_of(part)
    if got != md5:
        part.unlink()
        raise FetchError(f"{dest.name} from {url}: md5 {got} does not match the published {md5}; the download "
                         "was deleted. Fetch again (a mirror or proxy may have served a different file)")
    part.replace(dest)
    return dest


def _unpack(archive: Path, into: Path) -> None:
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():   # zipfile strips '..' and absolute paths itself; refuse them anyway
                if name.startswith("/") or ".." in Path(name).parts:
                    raise FetchError(f"{archive}: unsafe member {name!r}")
            z.extractall(into)
    else:
        with tarfile.open(archive) as t:
            t.extractall(into, filter="data")   # refuses absolute paths, '..' and links outside


def fetch_archive(name: str, archive: Archive, root: Path, base_url: str | None = None, stream=sys.stderr) -> Path:
    """Download, verify, unpack and convert one archive into ``root/archive.folder``."""
    target = root / archive.folder
    if target.exists():
        return target
    url = f"{base_url.rstrip('/')}/{archive.filename}" if base_url else archive.url
    downloads = root / ".downloads"
    path = download(url, downloads / archive.filename, archive.md5, stream=stream)
    staging = root / f".unpacking-{archive.folder}"
    shutil.rmtree(staging, ignore_errors=True)   # left by a crash during an earlier unpack
    try:
        _unpack(path, staging)
        unpacked = staging / archive.folder
        if not unpacked.is_dir():
            raise FetchError(f"{name}: {archive.filename} holds no top folder {archive.folder!r}")
        if archive.convert is not None:
            archive.convert(unpacked)
        unpacked.rename(target)   # one rename: the loader sees all or nothing
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    path.unlink()
    return target


def fetch(names: list[str], root: Path, base_url: str | None = None, stream=sys.stderr) -> list[str]:
    """Fetch each named dataset into ``root``; returns one line per name saying what happened."""
    from ..plugins import Harness
    base_url = base_url or os.environ.get(MIRROR_ENV) or None
    unknown = [n for n in names if n not in CATALOG]
    if unknown:
        raise FetchError(f"unknown dataset(s) {unknown}; known: {', '.join(CATALOG)}")
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for name in names:
        entry = CATALOG[name]
        if entry.how == "archive":
            for archive in entry.archives:
                lines.append(f"{name}: {fetch_archive(name, archive, root, base_url, stream)}")
        elif entry.how == "torchvision":
            source = Harness().datasets[entry.source](**entry.options)
            source.name = entry.source
            found = source.locate(root) if hasattr(source, "locate") else None
            if found is not None:   # a run reads it already (e.g. Debian's dataset-fashion-mnist)
                folder = next(iter(found[1].values())).parent
                lines.append(f"{name}: already present ({found[0]} {folder}), nothing fetched")
                continue
            try:
                for train in (True, False):
                    source.load(root, train, download=True)   # torchvision downloads and checks its md5 sums
            except (RuntimeError, FileNotFoundError) as exc:   # torchvision's "not found or corrupted"
                # (the source turns that into DatasetMissing, whose "add --clh-download" is no advice here)
                cause = exc.__cause__ if isinstance(exc, FileNotFoundError) and exc.__cause__ else exc
                raise FetchError(f"{name}: torchvision could not fetch it into {root}: {cause}") from None
            lines.append(f"{name}: fetched by torchvision into {root}")
        else:
            lines.append(f"{name}: not downloaded: {entry.instructions}")
    return lines


# ------------------------------------------------------------------------------------ check
def suite_datasets(suite_file: Path) -> list[tuple[str, dict]]:
    """Every (dataset, options) a suite file names: scenarios' dataset / tune_dataset / eval_dataset
    (and their *_options), [defaults], and tables in lists such as CLDyB's pool, in file order."""
    import tomllib
    data = tomllib.loads(Path(suite_file).read_text())
    found: list[tuple[str, dict]] = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str) and (key == "dataset" or key.endswith("_dataset")):
                    options = node.get("options" if key == "dataset" and "options" in node else f"{key}_options", {})
                    pair = (value, dict(options) if isinstance(options, dict) else {})
                    if pair not in found:
                        found.append(pair)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(data)
    return found


def missing_path(source, root: Path | None) -> Path | None:
    """The first file or folder of ``source``'s layout absent under ``root`` (None: present). Checks
    the layout the loaders read without decoding any image."""
    from .imagefolder import CUB200, ImageFolder, ImageNetR, TinyImageNet
    from .torchvision_sources import _TorchvisionSource
    if not source.needs_root:
        return None
    root = Path(root)
    if isinstance(source, _TorchvisionSource):
        wanted = source._required(root, True) + source._required(root, False)
    elif isinstance(source, TinyImageNet):
        base = root / "tiny-imagenet-200"
        wanted = [base / "wnids.txt", base / "train", base / "val" / "val_annotations.txt", base / "val" / "images"]
    elif isinstance(source, CUB200):
        base = root / "CUB_200_2011"
        wanted = [base / f"{t}.txt" for t in ("images", "image_class_labels", "train_test_split", "classes")]
        wanted.append(base / "images")
    elif isinstance(source, (ImageNetR, ImageFolder)):
        base = root / ("imagenet-r" if isinstance(source, ImageNetR) else source.options["path"])
        if not base.is_dir() or not any(p.is_dir() for p in base.iterdir()):
            return base
        return None
    else:
        try:
            source.load(root, True)
        except FileNotFoundError as exc:
            return Path(getattr(exc, "path", None) or root)
        return None
    return next((p for p in wanted if not p.exists()), None)


def check(suite_file: Path, root: Path | None, harness) -> tuple[list[list[str]], bool]:
    """Rows (dataset, status, how to get it) for a suite, and whether everything is present."""
    rows, ok = [], True
    for dataset, options in suite_datasets(suite_file):
        key, entry = entry_for(dataset, options)
        label = key if dataset != "imagefolder" else f"imagefolder:{key}"
        if dataset not in harness.datasets:
            rows.append([label, "unknown dataset (no plugin registers it)", "install or load the plugin that adds it"])
            ok = False
            continue
        source = harness.datasets[dataset](**options)
        source.name = dataset
        if not source.needs_root:
            rows.append([label, "present (no files needed)", entry.instructions or "-"])
            continue
        if hasattr(source, "locate"):   # the MNIST family: data root, then a system package's folder
            rows.append(_located(label, source, root, key, entry))
            ok &= rows[-1][1].startswith("present")
            continue
        if root is None:
            rows.append([label, "unknown: no data root (--root or CLH_DATA_ROOT)", _how(key, entry, root)])
            ok = False
            continue
        missing = missing_path(source, root)
        status = "present" if missing is None else f"missing: {missing}"
        ok &= missing is None
        rows.append([label, status, "-" if missing is None else _how(key, entry, root)])
    return rows, ok


def _located(label: str, source, root: Path | None, key: str, entry: Entry) -> list[str]:
    """The row of a source that searches several copies: the one a run will read, or every place looked."""
    found = source.locate(root)
    if found is not None:
        where = sorted({str(p.parent) for p in found[1].values()})
        return [label, f"present: {found[0]} {', '.join(where)} (a run reads this one)", "-"]
    looked = ", ".join(f"{name} {folder}" for name, folder in source.copies(root)) or "nowhere (no data root)"
    how = _how(key, entry, root)
    if getattr(source, "system_package", ""):
        how += f" (or apt-get install {source.system_package})"
    return [label, f"missing: looked in {looked}", how]


def _how(key: str, entry: Entry, root: Path | None) -> str:
    where = root if root is not None else "DIR"
    if entry.how in ("archive", "torchvision"):
        return f"clharness data fetch {key} --root {where}"
    return entry.instructions
