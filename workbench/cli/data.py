"""``streamrank data fetch movielens``: download a dataset the tools read, verified against its
pinned checksums (:mod:`workbench.datasets`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from streamrank.settings import Settings
from workbench.datasets import DATASETS


def _fetch(args: argparse.Namespace, settings: Settings) -> int:
    from workbench.cli.common import print_json
    from workbench.datasets import dataset_roots, default_dest, fetch_dataset, tqdm_bar

    spec = DATASETS[args.dataset]
    dest = args.dest if args.dest is not None else default_dest(settings.tools)
    report = fetch_dataset(
        spec,
        url=settings.tools.movielens_url,
        dest=dest,
        search=() if args.dest is not None else dataset_roots(settings.tools),
        timeout_s=args.timeout,
        bar=None if args.no_progress else tqdm_bar(f"{spec.name}.zip"),
    )
    if args.json:
        print_json(report.to_json())
    elif report.status == "present":
        print(f"{spec.title} is already in {report.path} (checksums verified); nothing to do")
    else:
        print(
            f"{spec.title}: {len(report.files)} files verified and installed in {report.path} "
            f"({report.downloaded_bytes:,} bytes downloaded)"
        )
    return 0


def register(sub: Any) -> None:
    data = sub.add_parser("data", help="datasets the tools read (fetch)")
    actions = data.add_subparsers(dest="data_action", metavar="ACTION")
    actions.required = True
    fetch = actions.add_parser(
        "fetch",
        help="download a dataset, verify its pinned checksums, install it where train, replay "
        "and the demo look",
    )
    fetch.add_argument("dataset", choices=sorted(DATASETS), help="movielens: MovieLens-100K")
    fetch.add_argument("--url", default=None,
                       help="zip to download, also file:///PATH (default: setting movielens_url)")  # fmt: skip
    fetch.add_argument("--dest", type=Path, default=None,
                       help="datasets folder; the files go to DIR/ml-100k/ (default: data_dir "
                       "when writable, else data_cache_dir)")  # fmt: skip
    fetch.add_argument("--timeout", type=float, default=30.0,
                       help="seconds to wait for the server to connect or send data")  # fmt: skip
    fetch.add_argument("--no-progress", action="store_true")
    fetch.add_argument("--json", action="store_true", help="print one JSON summary")
    fetch.set_defaults(func=_fetch, setting_flags={"url": "STREAMRANK_MOVIELENS_URL"})
