"""Datasets the tools read: where each one is found, and ``streamrank data fetch``, which
downloads a zip, verifies every file against pinned sha256 checksums and installs the files
atomically (a temporary file in the destination, then a rename)."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from streamrank.errors import DatasetError
from streamrank.settings.tools import ToolSettings

logger = logging.getLogger(__name__)

CHUNK = 1 << 16


@dataclass(frozen=True)
class PinnedFile:
    """One file of a dataset: its name, size in bytes and sha256 (hex)."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset as the loaders read it: the folder name under a datasets root and its files."""

    name: str
    title: str
    files: tuple[PinnedFile, ...]
    # Files that also mark a folder as holding the dataset (another format the loader reads).
    also_found_by: tuple[str, ...] = field(default=())

    def holds(self, folder: Path) -> bool:
        """Whether ``folder`` holds this dataset in a format the loader reads."""
        marks = (self.files[0].name, *self.also_found_by)
        return any((folder / mark).is_file() for mark in marks)


# RecBole atomic files of MovieLens-100K (the loader also reads GroupLens' u.data).
MOVIELENS_100K = DatasetSpec(
    name="ml-100k",
    title="MovieLens-100K",
    files=(
        PinnedFile(
            "ml-100k.inter",
            1_979_230,
            "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff",
        ),
        PinnedFile(
            "ml-100k.item",
            66_632,
            "51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532",
        ),
        PinnedFile(
            "ml-100k.user",
            22_697,
            "4f670007d9cfbeb9807e757209af1555b9bcc186bde25e767f67cb67c6dd5972",
        ),
    ),
    also_found_by=("u.data",),
)

DATASETS: Mapping[str, DatasetSpec] = {"movielens": MOVIELENS_100K}


# --- where datasets are found -------------------------------------------------------------------


def dataset_roots(tools: ToolSettings) -> tuple[Path, ...]:
    """The folders searched for a dataset, in order: ``data_dir``, then ``data_cache_dir``."""
    roots = (Path(tools.data_dir), Path(tools.data_cache_dir))
    return tuple(dict.fromkeys(roots))


def find_dataset(tools: ToolSettings, spec: DatasetSpec = MOVIELENS_100K) -> Path | None:
    """The first ``ROOT/<name>`` folder that holds the dataset, or None."""
    for root in dataset_roots(tools):
        if spec.holds(root / spec.name):
            return root / spec.name
    return None


def movielens_dir(tools: ToolSettings) -> Path:
    """The ml-100k folder the loaders read: the first one found, else ``data_dir/ml-100k`` (so
    that the loader's error names the primary place)."""
    return find_dataset(tools, MOVIELENS_100K) or Path(tools.data_dir) / MOVIELENS_100K.name


def default_dest(tools: ToolSettings) -> Path:
    """Where a fetch installs datasets: ``data_dir`` when it is writable (a shared read-only
    copy, or a fresh clone without one, is not), else ``data_cache_dir``."""
    data_dir = Path(tools.data_dir)
    return data_dir if writable(data_dir) else Path(tools.data_cache_dir)


def writable(folder: Path) -> bool:
    """Whether ``folder`` exists, is not marked read-only (no write permission bit at all: root
    would write through it) and takes a new file."""
    try:
        if not folder.is_dir() or not folder.stat().st_mode & 0o222:
            return False
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


# --- verification -------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    """The sha256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_folder(folder: Path, spec: DatasetSpec) -> dict[str, dict[str, Any]]:
    """Each pinned file of ``folder`` with its sha256 and size; raises DatasetError naming every
    missing or mismatching file."""
    found: dict[str, dict[str, Any]] = {}
    problems = []
    for pinned in spec.files:
        path = folder / pinned.name
        if not path.is_file():
            problems.append(f"{pinned.name} is missing")
            continue
        actual = sha256_file(path)
        if actual != pinned.sha256:
            problems.append(f"{pinned.name} has sha256 {actual}, expected {pinned.sha256}")
            continue
        found[pinned.name] = {"sha256": actual, "bytes": path.stat().st_size}
    if problems:
        raise DatasetError(f"{spec.title} in {folder} does not verify: " + "; ".join(problems))
    return found


def _members_by_name(
    archive: zipfile.ZipFile, spec: DatasetSpec
) -> dict[str, list[zipfile.ZipInfo]]:
    """The archive's members for each pinned file, matched by file name at any folder depth,
    shallowest first."""
    wanted = {pinned.name for pinned in spec.files}
    members: dict[str, list[zipfile.ZipInfo]] = {name: [] for name in wanted}
    for info in archive.infolist():
        name = PurePosixPath(info.filename).name
        if not info.is_dir() and name in wanted:
            members[name].append(info)
    for found in members.values():
        found.sort(key=lambda info: info.filename.count("/"))
    return members


def _extract_verified(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, pinned: PinnedFile, into: Path
) -> str | None:
    """Copy one member to ``into`` while hashing it; the sha256 when it matches the pin, else
    None (the copy is deleted)."""
    if info.file_size != pinned.size:
        return None
    digest = hashlib.sha256()
    with archive.open(info) as src, into.open("wb") as dst:
        for chunk in iter(lambda: src.read(CHUNK), b""):
            digest.update(chunk)
            dst.write(chunk)
    if digest.hexdigest() != pinned.sha256:
        into.unlink()
        return None
    return digest.hexdigest()


def extract_dataset(zip_path: Path, staging: Path, spec: DatasetSpec) -> dict[str, dict[str, Any]]:
    """Extract the pinned files of ``zip_path`` (at any folder depth) into ``staging``, each
    verified against its checksum; raises DatasetError (and leaves none of them) when a file is
    missing or none of its copies matches. Only the pinned file names are ever written."""
    try:
        archive = zipfile.ZipFile(zip_path)
    except zipfile.BadZipFile as exc:
        raise DatasetError(
            f"the download is not a zip archive ({exc}): refused and deleted"
        ) from exc
    extracted: dict[str, dict[str, Any]] = {}
    try:
        with archive:
            members = _members_by_name(archive, spec)
            for pinned in spec.files:
                candidates = members[pinned.name]
                if not candidates:
                    raise DatasetError(f"the archive holds no {pinned.name} (at any depth)")
                target = staging / pinned.name
                for info in candidates:
                    digest = _extract_verified(archive, info, pinned, target)
                    if digest is not None:
                        extracted[pinned.name] = {"sha256": digest, "bytes": pinned.size}
                        break
                else:
                    raise DatasetError(
                        f"{pinned.name} in the archive does not match its pinned checksum "
                        f"(sha256 {pinned.sha256}, {pinned.size} bytes): refused and deleted"
                    )
    except zipfile.BadZipFile as exc:
        _discard(staging, extracted)
        raise DatasetError(f"the archive is corrupt ({exc}): refused and deleted") from exc
    except (DatasetError, OSError):
        _discard(staging, extracted)
        raise
    return extracted


def _discard(staging: Path, names: Mapping[str, object]) -> None:
    for name in names:
        (staging / name).unlink(missing_ok=True)


# --- download -----------------------------------------------------------------------------------


def manual_steps(spec: DatasetSpec, url: str, dest: Path) -> str:
    """How to install the dataset by hand (no network here)."""
    names = ", ".join(pinned.name for pinned in spec.files)
    return (
        f"to install it by hand: download {url} on a machine with a network, then either run "
        f"`streamrank data fetch movielens --url file:///PATH/TO/{PurePosixPath(url).name}` "
        f"here, or unzip it and put {names} in {dest / spec.name}/ (or in DIR/{spec.name}/ and "
        "set STREAMRANK_DATA_DIR=DIR)"
    )


def download(
    url: str,
    target: IO[bytes],
    *,
    timeout_s: float,
    bar: Callable[[int | None], Any] | None = None,
) -> int:
    """Stream ``url`` into ``target``; the number of bytes. ``bar(total)`` makes a progress bar
    (an object with ``update(n)`` and ``close()``). Raises DatasetError when the URL cannot be
    read."""
    request = urllib.request.Request(url, headers={"User-Agent": "streamrank"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            length = response.headers.get("Content-Length")
            progress = bar(int(length) if length and length.isdigit() else None) if bar else None
            written = 0
            try:
                for chunk in iter(lambda: response.read(CHUNK), b""):
                    target.write(chunk)
                    written += len(chunk)
                    if progress is not None:
                        progress.update(len(chunk))
            finally:
                if progress is not None:
                    progress.close()
    except urllib.error.HTTPError as exc:
        raise DatasetError(f"{url} answered HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        raise DatasetError(f"cannot reach {url} ({exc.reason})") from exc
    except (TimeoutError, ConnectionError) as exc:
        raise DatasetError(f"the download from {url} failed ({exc})") from exc
    return written


def tqdm_bar(title: str) -> Callable[[int | None], Any]:
    """A tqdm byte bar on stderr, made once the total is known."""

    def make(total: int | None) -> Any:
        from tqdm import tqdm

        return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=title)

    return make


# --- fetch --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FetchReport:
    """What a fetch did: ``fetched`` (downloaded now) or ``present`` (already there, verified)."""

    dataset: str
    status: str
    path: Path
    files: dict[str, dict[str, Any]]
    url: str | None = None
    downloaded_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "status": self.status,
            "path": str(self.path),
            "files": self.files,
            "url": self.url,
            "downloaded_bytes": self.downloaded_bytes,
        }


def _remove_tree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except OSError as exc:  # a leftover temporary folder is harmless; say so and go on
        logger.warning("could not remove the temporary folder %s: %s", path, exc)


def present_copy(roots: tuple[Path, ...], spec: DatasetSpec) -> FetchReport | None:
    """The first copy under ``roots`` whose files all verify, as a ``present`` report."""
    for root in roots:
        folder = root / spec.name
        if not spec.holds(folder):
            continue
        try:
            files = verify_folder(folder, spec)
        except DatasetError:
            continue
        return FetchReport(spec.name, "present", folder, files)
    return None


def fetch_dataset(
    spec: DatasetSpec,
    *,
    url: str,
    dest: Path,
    search: tuple[Path, ...] = (),
    timeout_s: float = 30.0,
    bar: Callable[[int | None], Any] | None = None,
) -> FetchReport:
    """Install ``spec`` into ``dest/<name>`` from the zip at ``url``, unless a verified copy is
    already in ``dest`` or in one of ``search``. Files are verified before they are renamed into
    place; on any failure nothing of the download is left behind."""
    already = present_copy((dest, *search), spec)
    if already is not None:
        return already
    folder = dest / spec.name
    try:
        dest.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}-fetch-", dir=dest))
    except OSError as exc:
        raise DatasetError(f"cannot write to {dest} ({exc}); pass --dest DIR") from exc
    try:
        zip_path = staging / "download.zip"
        with zip_path.open("wb") as out:
            try:
                size = download(url, out, timeout_s=timeout_s, bar=bar)
            except DatasetError as exc:
                raise DatasetError(f"{exc}; {manual_steps(spec, url, dest)}") from exc
        try:
            files = extract_dataset(zip_path, staging, spec)
        except DatasetError as exc:
            raise DatasetError(
                f"{exc} (archive from {url}; another source: --url or STREAMRANK_MOVIELENS_URL)"
            ) from exc
        folder.mkdir(exist_ok=True)
        for name in files:
            os.replace(staging / name, folder / name)
    except OSError as exc:  # the local disk, not the network (download() turns those)
        raise DatasetError(f"cannot write to {folder} ({exc}); pass --dest DIR") from exc
    finally:
        _remove_tree(staging)
    return FetchReport(spec.name, "fetched", folder, files, url=url, downloaded_bytes=size)
