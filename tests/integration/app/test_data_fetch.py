"""``streamrank data fetch movielens`` through the real command: a local HTTP server serves a
zip built from the shared MovieLens-100K copy (seconds, no network)."""

from __future__ import annotations

import functools
import http.server
import json
import os
import socket
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scoring.training.data import load_movielens
from streamrank.settings import Settings
from workbench.cli.main import main
from workbench.datasets import MOVIELENS_100K, movielens_dir, verify_folder

ML100K = (
    Path(
        os.environ.get(
            "STREAMRANK_DATA_DIR", Path(__file__).resolve().parents[4] / "shared" / "datasets"
        )
    )
    / "ml-100k"
)
needs_ml100k = pytest.mark.skipif(
    not all((ML100K / p.name).is_file() for p in MOVIELENS_100K.files),
    reason=f"MovieLens-100K not found at {ML100K} (set STREAMRANK_DATA_DIR)",
)
PINNED = {p.name: {"sha256": p.sha256, "bytes": p.size} for p in MOVIELENS_100K.files}


class Server:
    """A static file server on 127.0.0.1 (a free port) in a thread, counting GET requests."""

    def __init__(self, root: Path) -> None:
        self.gets = 0
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                server.gets += 1
                super().do_GET()

            def log_message(self, format: str, *args: Any) -> None:  # quiet test output
                pass

        handler = functools.partial(Handler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Server]:
    root = tmp_path / "www"
    root.mkdir()
    server = Server(root)
    yield server
    server.close()


def recbole_zip(path: Path, *, corrupt: str | None = None) -> None:
    """The shared files as RecBole's zip lays them out (in an ``ml-100k/`` folder); ``corrupt``
    names a file whose last byte is changed (same size, another checksum)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for pinned in MOVIELENS_100K.files:
            data = bytearray((ML100K / pinned.name).read_bytes())
            if pinned.name == corrupt:
                data[-1] ^= 0x01
            archive.writestr(f"ml-100k/{pinned.name}", bytes(data))


def fetch(*argv: str) -> int:
    return main(["data", "fetch", "movielens", *argv])


@needs_ml100k
def test_fetch_installs_verified_files_where_train_finds_them(
    served: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    recbole_zip(tmp_path / "www" / "ml-100k.zip")
    cache = tmp_path / "cache"
    monkeypatch.setenv("STREAMRANK_DATA_DIR", str(tmp_path / "no-shared-here"))  # a fresh clone
    monkeypatch.setenv("STREAMRANK_DATA_CACHE_DIR", str(cache))
    monkeypatch.setenv("STREAMRANK_MOVIELENS_URL", served.url("ml-100k.zip"))

    assert fetch("--json") == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["status"] == "fetched"
    assert report["path"] == str(cache / "ml-100k")
    assert report["files"] == PINNED
    assert report["downloaded_bytes"] == (tmp_path / "www" / "ml-100k.zip").stat().st_size
    assert "ml-100k.zip" in err  # the progress bar
    assert verify_folder(cache / "ml-100k", MOVIELENS_100K) == PINNED
    assert sorted(p.name for p in cache.iterdir()) == ["ml-100k"]  # no temporary files left

    found = movielens_dir(Settings().tools)
    assert found == cache / "ml-100k"  # where train and the demo look
    assert load_movielens(found).n_events == 100_000

    assert fetch() == 0  # idempotent: verified and left alone, nothing downloaded
    assert "already in" in capsys.readouterr().out
    assert served.gets == 1


@needs_ml100k
def test_dest_overrides_and_a_corrupt_file_is_refused(
    served: Server, tmp_path: Path, capsys: Any
) -> None:
    recbole_zip(tmp_path / "www" / "bad.zip", corrupt="ml-100k.item")
    dest = tmp_path / "datasets"
    assert fetch("--url", served.url("bad.zip"), "--dest", str(dest), "--no-progress") == 1
    err = capsys.readouterr().err
    assert "ml-100k.item in the archive does not match its pinned checksum" in err
    assert "refused and deleted" in err
    assert list(dest.iterdir()) == []  # nothing installed, the download deleted

    recbole_zip(tmp_path / "www" / "good.zip")
    assert fetch("--url", served.url("good.zip"), "--dest", str(dest), "--no-progress") == 0
    assert verify_folder(dest / "ml-100k", MOVIELENS_100K) == PINNED


def test_an_unreachable_url_says_how_to_install_by_hand(
    served: Server, tmp_path: Path, capsys: Any
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dest = tmp_path / "datasets"
    url = f"http://127.0.0.1:{port}/ml-100k.zip"
    assert fetch("--url", url, "--dest", str(dest), "--no-progress", "--timeout", "5") == 1
    err = capsys.readouterr().err
    assert f"cannot reach {url}" in err
    assert "file:///PATH/TO/ml-100k.zip" in err
    assert f"ml-100k.inter, ml-100k.item, ml-100k.user in {dest / 'ml-100k'}/" in err
    assert list(dest.iterdir()) == []

    assert fetch("--url", served.url("missing.zip"), "--dest", str(dest), "--no-progress") == 1
    assert "answered HTTP 404" in capsys.readouterr().err
