"""Dataset lookup, checksum verification and extraction (:mod:`workbench.datasets`), on a
small dataset made up here; the real download path is in tests/integration/app/test_data_fetch.py."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from streamrank.errors import DatasetError
from streamrank.settings import Settings
from workbench.datasets import (
    DatasetSpec,
    PinnedFile,
    dataset_roots,
    default_dest,
    extract_dataset,
    fetch_dataset,
    find_dataset,
    movielens_dir,
    verify_folder,
)

CONTENT = {"toy.inter": b"user_id:token\titem_id:token\n1\t2\n", "toy.item": b"item_id:token\n2\n"}
SPEC = DatasetSpec(
    name="toy",
    title="Toy",
    files=tuple(
        PinnedFile(name, len(data), hashlib.sha256(data).hexdigest())
        for name, data in CONTENT.items()
    ),
)


def make_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def write_folder(folder: Path, content: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in content.items():
        (folder / name).write_bytes(data)
    return folder


def tools(data_dir: Path, cache: Path) -> Settings:
    return Settings().with_env(STREAMRANK_DATA_DIR=data_dir, STREAMRANK_DATA_CACHE_DIR=cache)


def test_verify_folder_reports_each_file_with_its_checksum(tmp_path: Path) -> None:
    files = verify_folder(write_folder(tmp_path / "toy", CONTENT), SPEC)
    assert files == {
        p.name: {"sha256": p.sha256, "bytes": p.size} for p in SPEC.files
    }  # fmt: skip


def test_verify_folder_names_the_missing_and_the_mismatching_file(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "toy", {"toy.inter": b"changed"})
    with pytest.raises(DatasetError) as err:
        verify_folder(folder, SPEC)
    assert "toy.inter has sha256" in str(err.value)
    assert "toy.item is missing" in str(err.value)


def test_extract_finds_the_files_at_any_depth(tmp_path: Path) -> None:
    members = {f"a/b/toy/{name}": data for name, data in CONTENT.items()}
    members["a/__MACOSX/._toy.inter"] = b"resource fork"  # another name: ignored
    staging = tmp_path / "staging"
    staging.mkdir()
    files = extract_dataset(make_zip(tmp_path / "t.zip", members), staging, SPEC)
    assert sorted(files) == sorted(CONTENT)
    assert {p.name: p.read_bytes() for p in staging.iterdir()} == CONTENT


def test_extract_takes_the_copy_that_verifies(tmp_path: Path) -> None:
    members = {"toy.inter": b"x" * len(CONTENT["toy.inter"]), "toy.item": CONTENT["toy.item"]}
    members["deeper/toy.inter"] = CONTENT["toy.inter"]
    staging = tmp_path / "staging"
    staging.mkdir()
    extract_dataset(make_zip(tmp_path / "t.zip", members), staging, SPEC)
    assert (staging / "toy.inter").read_bytes() == CONTENT["toy.inter"]


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ({**CONTENT, "toy.item": b"item_id:token\n3\n"}, "toy.item in the archive does not match"),
        ({**CONTENT, "toy.inter": b"short"}, "toy.inter in the archive does not match"),
        ({"toy.inter": CONTENT["toy.inter"]}, "holds no toy.item"),
    ],
)
def test_extract_refuses_and_leaves_nothing(
    tmp_path: Path, members: dict[str, bytes], message: str
) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(DatasetError, match=message):
        extract_dataset(make_zip(tmp_path / "t.zip", members), staging, SPEC)
    assert list(staging.iterdir()) == []


def test_extract_refuses_what_is_not_a_zip(tmp_path: Path) -> None:
    page = tmp_path / "t.zip"
    page.write_text("<html>captive portal</html>")
    with pytest.raises(DatasetError, match="not a zip archive"):
        extract_dataset(page, tmp_path, SPEC)


def test_fetch_installs_then_finds_its_copy_without_downloading(tmp_path: Path) -> None:
    url = make_zip(tmp_path / "t.zip", {f"toy/{n}": d for n, d in CONTENT.items()}).as_uri()
    dest = tmp_path / "datasets"
    report = fetch_dataset(SPEC, url=url, dest=dest)
    assert report.status == "fetched"
    assert report.path == dest / "toy"
    assert report.downloaded_bytes == (tmp_path / "t.zip").stat().st_size
    assert sorted(p.name for p in dest.iterdir()) == ["toy"]  # no temporary folder left
    verify_folder(dest / "toy", SPEC)
    again = fetch_dataset(SPEC, url="http://127.0.0.1:9/never-read.zip", dest=dest)
    assert (again.status, again.path, again.files) == ("present", dest / "toy", report.files)


def test_fetch_replaces_a_corrupt_copy(tmp_path: Path) -> None:
    url = make_zip(tmp_path / "t.zip", CONTENT).as_uri()
    dest = tmp_path / "datasets"
    write_folder(dest / "toy", {"toy.inter": b"truncated", "other.txt": b"kept"})
    assert fetch_dataset(SPEC, url=url, dest=dest).status == "fetched"
    verify_folder(dest / "toy", SPEC)
    assert (dest / "toy" / "other.txt").read_bytes() == b"kept"


def test_fetch_reports_a_verified_copy_in_a_searched_root(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    write_folder(shared / "toy", CONTENT)
    report = fetch_dataset(
        SPEC, url="http://127.0.0.1:9/never-read.zip", dest=tmp_path / "cache", search=(shared,)
    )
    assert (report.status, report.path) == ("present", shared / "toy")
    assert not (tmp_path / "cache").exists()


def test_the_cache_is_searched_after_the_data_dir(tmp_path: Path) -> None:
    data_dir, cache = tmp_path / "data", tmp_path / "cache"
    settings = tools(data_dir, cache).tools
    assert dataset_roots(settings) == (data_dir, cache)
    assert find_dataset(settings) is None
    assert movielens_dir(settings) == data_dir / "ml-100k"  # the loader's error names it
    write_folder(cache / "ml-100k", {"ml-100k.inter": b""})
    assert movielens_dir(settings) == cache / "ml-100k"
    write_folder(data_dir / "ml-100k", {"u.data": b""})  # GroupLens files count too
    assert movielens_dir(settings) == data_dir / "ml-100k"


def test_fetch_goes_to_the_cache_unless_the_data_dir_is_writable(tmp_path: Path) -> None:
    data_dir, cache = tmp_path / "data", tmp_path / "cache"
    settings = tools(data_dir, cache).tools
    assert default_dest(settings) == cache  # absent (a fresh clone without ../shared)
    data_dir.mkdir()
    assert default_dest(settings) == data_dir
    data_dir.chmod(0o555)  # read-only, like the shared copy
    try:
        assert default_dest(settings) == cache
    finally:
        data_dir.chmod(0o755)
