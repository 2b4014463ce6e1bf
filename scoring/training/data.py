"""MovieLens loading (RecBole atomic and GroupLens formats) and the DIN training samples.

Event ids and order: ``event_id`` is the rating's 0-based row position in the interaction
file (header excluded), zero-padded to 8 digits, so string order = file order. A user's
history is ordered by ``(ts, event_id)``: the same rule the streams worker uses for the Redis
sequences, which is what makes offline and online scores comparable.

Samples (leave-last-out): per user, chronological; every position ``i >= 1`` yields a positive
(the item at ``i``) at the sample time ``ts[i]`` with the user's ``<= history_len`` latest events
strictly before that time as history (point in time: events of the same second are not known
yet, whatever their event id), plus one negative drawn (seeded) from the items the user never
rated. The user's last event is test, the one
before validation, the rest train. Test and validation candidates are the held-out positive
plus ``n_negatives`` sampled negatives.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from scoring.model.features import AGE_BUCKETS
from scoring.training.movielens_files import (
    atomic_header,
    need_columns,
    read_item_genres,
    read_user_attributes,
)
from streamrank.errors import ArtifactError, ConfigError

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Dataset:
    """Interactions in file order plus item categories, with string ids kept verbatim.

    ``items`` is the item vocabulary (index = item index used by the model); ``item_genres``
    holds each item's category indices (an item may have several; ``genre_mask`` marks the real
    ones) into ``genres``.
    """

    name: str
    user_ids: npt.NDArray[np.str_]  # [n] raw user id per event
    item_index: IntArray  # [n] index into ``items``
    ts: IntArray  # [n] epoch seconds
    items: tuple[str, ...]  # [n_items] raw item ids
    genres: tuple[str, ...]  # category vocabulary
    item_genres: IntArray  # [n_items, G] category indices (0-padded)
    genre_mask: npt.NDArray[np.bool_]  # [n_items, G]
    sha256: str  # of the files read, in the order read
    users: dict[str, dict[str, str]] = field(default_factory=dict)  # optional profile

    @property
    def n_events(self) -> int:
        return int(self.item_index.shape[0])

    def event_ids(self) -> list[str]:
        """Zero-padded row positions (string order = file order)."""
        return [f"{row:08d}" for row in range(self.n_events)]

    def item_category(self, item: int) -> str:
        """The item's categories joined by ``|`` (what a click event carries as category)."""
        return "|".join(
            self.genres[g]
            for g, m in zip(self.item_genres[item], self.genre_mask[item], strict=True)
            if m
        )


def _sha256_files(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _genre_matrix(
    item_ids: list[str], genre_lists: dict[str, list[str]]
) -> tuple[tuple[str, ...], IntArray, npt.NDArray[np.bool_]]:
    vocab = sorted({g for gs in genre_lists.values() for g in gs} | {"unknown"})
    index = {g: i for i, g in enumerate(vocab)}
    width = max((len(gs) for gs in genre_lists.values()), default=1) or 1
    mat = np.zeros((len(item_ids), width), dtype=np.int64)  # [n_items, G]
    mask = np.zeros((len(item_ids), width), dtype=bool)  # [n_items, G]
    for row, item in enumerate(item_ids):
        gs = genre_lists.get(item) or ["unknown"]  # items without metadata: the 'unknown' genre
        mat[row, : len(gs)] = [index[g] for g in gs]
        mask[row, : len(gs)] = True
    return tuple(vocab), mat, mask


def _build(
    name: str,
    users: list[str],
    items: list[str],
    ts: list[int],
    genre_lists: dict[str, list[str]],
    sha: str,
    profiles: dict[str, dict[str, str]],
) -> Dataset:
    if not users:
        raise ConfigError(f"{name}: no interactions found")
    vocab = sorted(set(items), key=lambda s: (len(s), s))  # numeric-looking ids in numeric order
    pos = {item: i for i, item in enumerate(vocab)}
    genres, item_genres, mask = _genre_matrix(vocab, genre_lists)
    return Dataset(
        name=name,
        user_ids=np.asarray(users, dtype=np.str_),
        item_index=np.fromiter((pos[i] for i in items), dtype=np.int64, count=len(items)),
        ts=np.asarray(ts, dtype=np.int64),
        items=tuple(vocab),
        genres=genres,
        item_genres=item_genres,
        genre_mask=mask,
        sha256=sha,
        users=profiles,
    )


def load_recbole(folder: Path, name: str = "ml-100k") -> Dataset:
    """RecBole atomic files ``{name}.inter`` (+ optional ``.item`` with ``class``, ``.user``)."""
    inter = folder / f"{name}.inter"
    item_file, user_file = folder / f"{name}.item", folder / f"{name}.user"
    read = [inter]
    users, items, ts = [], [], []
    with inter.open(encoding="utf-8") as fh:
        cols = atomic_header(fh.readline(), inter)
        need_columns(cols, ("user_id", "item_id", "timestamp"), inter)
        u, i, t = cols["user_id"], cols["item_id"], cols["timestamp"]
        for lineno, line in enumerate(fh, start=2):
            parts = line.rstrip("\n").split("\t")
            if len(parts) < len(cols):
                raise ConfigError(f"{inter}:{lineno}: expected {len(cols)} tab-separated fields")
            users.append(parts[u])
            items.append(parts[i])
            ts.append(int(float(parts[t])))
    genre_lists: dict[str, list[str]] = {}
    if item_file.exists():
        read.append(item_file)
        genre_lists = read_item_genres(item_file)
    profiles: dict[str, dict[str, str]] = {}
    if user_file.exists():
        read.append(user_file)
        profiles = read_user_attributes(user_file)
    return _build(name, users, items, ts, genre_lists, _sha256_files(read), profiles)


def load_grouplens(folder: Path) -> Dataset:
    """GroupLens files: ``u.data`` (tab: user item rating ts), ``u.item`` (pipe, 19 genre flags
    last), ``u.user`` (pipe: id|age|gender|occupation|zip)."""
    data, item_file, user_file = folder / "u.data", folder / "u.item", folder / "u.user"
    read = [data]
    users, items, ts = [], [], []
    with data.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            parts = line.split()
            if len(parts) != 4:
                raise ConfigError(f"{data}:{lineno}: expected 4 fields (user item rating ts)")
            users.append(parts[0])
            items.append(parts[1])
            ts.append(int(parts[3]))
    genre_lists: dict[str, list[str]] = {}
    if item_file.exists():
        read.append(item_file)
        genre_lists = read_item_genres(item_file)
    profiles: dict[str, dict[str, str]] = {}
    if user_file.exists():
        read.append(user_file)
        profiles = read_user_attributes(user_file)
    return _build("ml-100k", users, items, ts, genre_lists, _sha256_files(read), profiles)


def load_movielens(folder: Path) -> Dataset:
    """Load whichever format ``folder`` holds (RecBole ``ml-100k.inter`` or GroupLens ``u.data``)."""
    folder = Path(folder)
    if not (folder / "ml-100k.inter").exists() and (folder / "ml-100k").is_dir():
        folder = folder / "ml-100k"  # given the datasets root
    if (folder / "ml-100k.inter").exists():
        return load_recbole(folder)
    if (folder / "u.data").exists():
        return load_grouplens(folder)
    inters = sorted(folder.glob("*.inter")) if folder.is_dir() else []
    if inters:
        return load_recbole(folder, inters[0].stem)
    raise ArtifactError(
        f"no MovieLens data in {folder}: expected ml-100k.inter (RecBole) or u.data (GroupLens); "
        "run `streamrank data fetch movielens`, pass --data DIR or set STREAMRANK_DATA_DIR to "
        "the folder holding ml-100k/"
    )


# --- samples ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Samples:
    """Fixed-width training/evaluation samples.

    ``hist`` holds item indices (0 where padded; ``hist_mask`` marks real events, oldest first,
    left-aligned) and ``hist_rows`` the event rows they came from (-1 where padded). ``ts`` is the
    sample time (epoch ms): the "as of" of every feature of the sample.
    """

    user: npt.NDArray[np.str_]  # [n]
    hist: IntArray  # [n, L]
    hist_mask: npt.NDArray[np.bool_]  # [n, L]
    hist_rows: IntArray  # [n, L]
    cand: IntArray  # [n] (train) or [n, C] (eval)
    label: npt.NDArray[np.float32]  # like cand
    ts: IntArray  # [n] epoch ms: the sample time (its positive event's time)

    def __len__(self) -> int:
        return int(self.hist.shape[0])


@dataclass(frozen=True)
class Split:
    train: Samples
    valid: Samples
    test: Samples
    train_item_counts: IntArray  # [n_items] positives per item in the train split (popularity)


def subset(ds: Dataset, rows: npt.NDArray[np.int64], *, name: str | None = None) -> Dataset:
    """The events at ``rows`` (in that order) as a dataset of their own: its item vocabulary
    holds only the items they touch, the category vocabulary stays the whole catalogue's."""
    genre_lists = {ds.items[i]: [ds.genres[g] for g, m in zip(ds.item_genres[i], ds.genre_mask[i],
                                                              strict=True) if m]
                   for i in range(len(ds.items))}  # fmt: skip
    return _build(
        name or ds.name,
        ds.user_ids[rows].tolist(),
        [ds.items[i] for i in ds.item_index[rows].tolist()],
        ds.ts[rows].tolist(),
        genre_lists,
        f"{ds.sha256}:{len(rows)}",
        ds.users,
    )


def time_order(ds: Dataset) -> IntArray:
    """Event rows sorted by (ts, event_id) over all users: the log as it happened."""
    return np.lexsort((np.arange(ds.n_events), ds.ts))  # last key is primary


def chronological_order(ds: Dataset) -> IntArray:
    """Event rows sorted by (user, ts, event_id); event_id order = row order."""
    rows = np.arange(ds.n_events)
    return np.lexsort((rows, ds.ts, ds.user_ids))  # last key is primary


def _negatives(
    rng: np.random.Generator, n_items: int, seen: IntArray, count: int, *, distinct: bool, user: str
) -> IntArray:
    """``count`` items the user never rated (``seen`` sorted), distinct if asked; seeded."""
    available = n_items - len(seen)
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    if available < (count if distinct else 1):
        raise ConfigError(
            f"user {user!r} rated {len(seen)} of {n_items} items: cannot draw {count} unrated "
            "negatives; lower the negatives count"
        )
    if available < n_items // 2:  # dense user: sample from the explicit complement
        pool = np.setdiff1d(np.arange(n_items), seen, assume_unique=True)
        return rng.choice(pool, size=count, replace=not distinct).astype(np.int64)
    out: list[int] = []
    taken: set[int] = set()
    while len(out) < count:  # rejection sampling: most items are unrated
        draw = rng.integers(0, n_items, size=2 * count + 8)
        hit = seen[np.minimum(np.searchsorted(seen, draw), len(seen) - 1)] == draw
        for item in draw[~hit].tolist():
            if distinct and item in taken:
                continue
            taken.add(item)
            out.append(item)
            if len(out) == count:
                break
    return np.asarray(out, dtype=np.int64)


def build_samples(
    ds: Dataset, *, history_len: int = 50, n_negatives: int = 20, seed: int = 17
) -> Split:
    """Leave-last-out samples (see the module docstring); deterministic for a given seed."""
    rng = np.random.default_rng(seed)
    n_items = len(ds.items)
    order = chronological_order(ds)
    users_sorted = ds.user_ids[order]
    starts = np.flatnonzero(np.r_[True, users_sorted[1:] != users_sorted[:-1]])
    ends = np.r_[starts[1:], len(order)]
    parts: dict[str, list] = {k: [] for k in ("train", "valid", "test")}
    counts = np.zeros(n_items, dtype=np.int64)
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        rows = order[s:e]  # this user's events, chronological
        n = len(rows)
        if n < 4:  # need >= 1 train position plus validation and test
            continue
        seq = ds.item_index[rows]
        seen = np.unique(seq)
        user = str(users_sorted[s])
        times = ds.ts[rows] * 1000  # [n] epoch ms, ascending
        # positions 1..n-1: train = 1..n-3, valid = n-2, test = n-1
        pos = np.arange(1, n)
        end = np.searchsorted(times, times[pos], side="left")  # [P] first event not before
        lo = np.maximum(end - history_len, 0)
        offs = np.arange(history_len)
        idx = lo[:, None] + offs[None, :]  # [P, L]
        mask = idx < end[:, None]  # [P, L]
        hist_rows = np.where(mask, rows[np.minimum(idx, n - 1)], -1)  # [P, L]
        hist = np.where(mask, seq[np.minimum(idx, n - 1)], 0)  # [P, L]
        n_train = n - 3
        train_neg = _negatives(rng, n_items, seen, n_train, distinct=False, user=user)
        parts["train"].append((user, hist[:n_train], mask[:n_train], hist_rows[:n_train],
                               seq[1 : n - 2], train_neg, times[1 : n - 2]))  # fmt: skip
        counts += np.bincount(seq[: n - 2], minlength=n_items)
        for name, p in (("valid", n - 3), ("test", n - 2)):
            neg = _negatives(rng, n_items, seen, n_negatives, distinct=True, user=user)
            cands = np.r_[seq[p + 1], neg]
            parts[name].append(
                (user, hist[p : p + 1], mask[p : p + 1], hist_rows[p : p + 1], cands,
                 times[p + 1 : p + 2])
            )  # fmt: skip
    return Split(
        train=_stack_train(parts["train"], history_len),
        valid=_stack_eval(parts["valid"], history_len, n_negatives),
        test=_stack_eval(parts["test"], history_len, n_negatives),
        train_item_counts=counts,
    )


def _stack_train(parts: list, history_len: int) -> Samples:
    users = (
        np.concatenate([np.full(len(p[4]) * 2, p[0]) for p in parts])
        if parts
        else np.zeros(0, np.str_)
    )
    hist = np.concatenate([np.repeat(p[1], 2, axis=0) for p in parts])  # [2P, L]: pos, neg pairs
    mask = np.concatenate([np.repeat(p[2], 2, axis=0) for p in parts])
    rows = np.concatenate([np.repeat(p[3], 2, axis=0) for p in parts])
    cand = np.concatenate([np.stack([p[4], p[5]], axis=1).reshape(-1) for p in parts])  # [2P]
    label = np.tile(np.array([1.0, 0.0], dtype=np.float32), len(cand) // 2)
    ts = np.concatenate([np.repeat(p[6], 2) for p in parts])  # [2P]
    return Samples(users, hist, mask, rows, cand, label, ts)


def _stack_eval(parts: list, history_len: int, n_negatives: int) -> Samples:
    users = np.asarray([p[0] for p in parts], dtype=np.str_)
    cand = np.stack([p[4] for p in parts])  # [U, 1 + neg]
    label = np.zeros(cand.shape, dtype=np.float32)
    label[:, 0] = 1.0
    return Samples(
        users,
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] for p in parts]),
        np.concatenate([p[3] for p in parts]),
        cand,
        label,
        np.concatenate([p[5] for p in parts]),
    )


def attribute_vocab(ds: Dataset) -> dict[str, tuple[str, ...]]:
    """The user attribute vocabularies of the data (age buckets, the genders and occupations seen);
    empty when the data has no user attributes."""
    if not ds.users:
        return {}
    vocab: dict[str, tuple[str, ...]] = {"age": AGE_BUCKETS}
    for name in ("gender", "occupation"):
        vocab[name] = tuple(sorted({p[name] for p in ds.users.values() if p.get(name)}))
    return vocab
