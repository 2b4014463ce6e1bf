"""The MovieLens side files: item genres and user attributes (RecBole atomic ``.item`` /
``.user``, GroupLens ``u.item`` / ``u.user``), for training (:mod:`scoring.training.data`) and
for the attribute tables the scoring side reads (``streamrank features load``)."""

from __future__ import annotations

from pathlib import Path

from streamrank.errors import ConfigError

# The 19 genre flags of GroupLens u.item, in column order.
GROUPLENS_GENRES: tuple[str, ...] = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
    "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
    "Romance", "Sci-Fi", "Thriller", "War", "Western",
)  # fmt: skip


def atomic_header(line: str, path: Path) -> dict[str, int]:
    """Column name -> position, from a RecBole header line (``name:type`` tab-separated)."""
    cols = {}
    for pos, col in enumerate(line.rstrip("\n").split("\t")):
        cols[col.split(":", 1)[0]] = pos
    return cols


def need_columns(cols: dict[str, int], names: tuple[str, ...], path: Path) -> None:
    """Raise ConfigError naming the columns of ``names`` the header lacks."""
    missing = [n for n in names if n not in cols]
    if missing:
        raise ConfigError(f"{path}: header lacks column(s) {', '.join(missing)}")


USER_ATTRIBUTES: tuple[str, ...] = ("age", "gender", "occupation")  # kept of a user file


def _is_atomic(path: Path) -> bool:
    """RecBole atomic (tab-separated, typed header ``name:type``) rather than GroupLens
    (pipe-separated, no header)."""
    with path.open(encoding="latin-1") as fh:
        first = fh.readline()
    return "\t" in first and ":" in first.split("\t", 1)[0]


def read_item_genres(path: Path) -> dict[str, list[str]]:
    """Each item's genres, in the file's order: a RecBole ``.item`` (``class`` or ``genre``
    column, space-separated) or a GroupLens ``u.item`` (Latin-1, pipe, 19 genre flags last)."""
    genre_lists: dict[str, list[str]] = {}
    if _is_atomic(path):
        with path.open(encoding="utf-8") as fh:
            cols = atomic_header(fh.readline(), path)
            need_columns(cols, ("item_id",), path)
            gcol = cols.get("class", cols.get("genre"))
            for line in fh:
                parts = line.rstrip("\n").split("\t")
                if gcol is not None and gcol < len(parts):
                    genre_lists[parts[cols["item_id"]]] = parts[gcol].split()
        return genre_lists
    for lineno, line in enumerate(path.read_text(encoding="latin-1").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < 5 + len(GROUPLENS_GENRES):
            raise ConfigError(f"{path}:{lineno}: expected 19 genre flags after 5 fields")
        flags = parts[-len(GROUPLENS_GENRES) :]
        genre_lists[parts[0]] = [
            g for g, f in zip(GROUPLENS_GENRES, flags, strict=True) if f == "1"
        ]
    return genre_lists


def read_item_categories(path: Path) -> dict[str, str]:
    """Each item's category string as :meth:`Dataset.item_category` gives it: its genres in
    the file's order joined by ``|`` (``unknown`` when it has none)."""
    return {item: "|".join(gs or ["unknown"]) for item, gs in read_item_genres(path).items()}


def read_user_attributes(path: Path) -> dict[str, dict[str, str]]:
    """Each user's :data:`USER_ATTRIBUTES` the file has: a RecBole ``.user`` (typed header) or
    a GroupLens ``u.user`` (Latin-1, ``id|age|gender|occupation|zip``)."""
    out: dict[str, dict[str, str]] = {}
    if _is_atomic(path):
        with path.open(encoding="utf-8") as fh:
            cols = atomic_header(fh.readline(), path)
            need_columns(cols, ("user_id",), path)
            kept = {k: c for k, c in cols.items() if k in USER_ATTRIBUTES}
            for lineno, line in enumerate(fh, start=2):
                parts = line.rstrip("\n").split("\t")
                if not line.strip():
                    continue
                if len(parts) < len(cols):
                    raise ConfigError(f"{path}:{lineno}: expected {len(cols)} tab-separated fields")
                out[parts[cols["user_id"]]] = {k: parts[c] for k, c in kept.items()}
        return out
    for lineno, line in enumerate(path.read_text(encoding="latin-1").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < 4:
            raise ConfigError(f"{path}:{lineno}: expected id|age|gender|occupation|zip")
        out[parts[0]] = dict(zip(USER_ATTRIBUTES, parts[1:4], strict=True))
    return out
