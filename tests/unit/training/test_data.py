"""MovieLens loaders (both formats), event ids/order, and the leave-last-out samples."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from scoring.training.data import (
    build_samples,
    chronological_order,
    load_movielens,
)
from scoring.training.movielens_files import (
    GROUPLENS_GENRES,
    read_item_categories,
    read_user_attributes,
)
from streamrank.errors import ArtifactError, ConfigError

ML100K = (
    Path(
        os.environ.get(
            "STREAMRANK_DATA_DIR", Path(__file__).resolve().parents[4] / "shared" / "datasets"
        )
    )
    / "ml-100k"
)

# user, item, rating, ts: user 1 has a timestamp tie between rows 1 and 2 (event_id decides)
ROWS = [
    ("1", "10", 4, 100),
    ("1", "20", 3, 200),
    ("1", "30", 5, 200),
    ("2", "10", 2, 50),
    ("1", "40", 1, 150),
    ("2", "20", 4, 60),
    ("2", "30", 4, 70),
    ("2", "50", 4, 80),
    ("1", "50", 2, 300),
    ("3", "60", 5, 10),  # user 3 (too few events to sample) makes unrated items exist
    ("3", "70", 5, 20),
    ("3", "80", 5, 30),
]


def _flags(*genres: str) -> str:
    return "|".join("1" if g in genres else "0" for g in GROUPLENS_GENRES)


def write_grouplens(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "u.data").write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in ROWS))
    items = {
        "10": ("Action", "Comedy"),
        "20": ("Drama",),
        "30": ("Sci-Fi",),
        "40": ("Film-Noir", "Drama"),
        "50": (),
    }
    lines = [f"{i}|Caf\xe9 {i} (1995)|01-Jan-1995||http://x|{_flags(*g)}" for i, g in items.items()]
    (folder / "u.item").write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    (folder / "u.user").write_text("1|24|M|technician|85711\n2|53|F|other|94043\n")
    return folder


def write_recbole(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    inter = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    inter += "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in ROWS)
    (folder / "ml-100k.inter").write_text(inter)
    item = "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
    item += "10\tA\t1995\tAction Comedy\n20\tB\t1995\tDrama\n30\tC\t1995\tSci-Fi\n40\tD\t1995\tFilm-Noir Drama\n"
    (folder / "ml-100k.item").write_text(item)
    (folder / "ml-100k.user").write_text(
        "user_id:token\tage:token\tgender:token\toccupation:token\n1\t24\tM\tx\n"
    )
    return folder


@pytest.mark.parametrize("writer", [write_grouplens, write_recbole])
def test_loaders_agree_on_events_and_categories(tmp_path: Path, writer) -> None:  # type: ignore[no-untyped-def]
    ds = load_movielens(writer(tmp_path / "ml"))
    assert ds.n_events == len(ROWS)
    assert ds.user_ids.tolist() == [r[0] for r in ROWS]
    assert [ds.items[i] for i in ds.item_index] == [r[1] for r in ROWS]
    assert ds.ts.tolist() == [r[3] for r in ROWS]
    assert ds.event_ids()[:3] == ["00000000", "00000001", "00000002"]
    cat = {ds.items[i]: ds.item_category(i) for i in range(len(ds.items))}
    assert cat["10"] == "Action|Comedy"
    assert cat["40"] == "Drama|Film-Noir" or cat["40"] == "Film-Noir|Drama"
    assert cat["50"] == "unknown"  # no genre flag / no metadata
    assert ds.users["1"]["age"] == "24"


@pytest.mark.parametrize("writer", [write_grouplens, write_recbole])
def test_attribute_files_read_as_the_dataset_does(tmp_path: Path, writer) -> None:  # type: ignore[no-untyped-def]
    """The category strings loaded into Redis equal Dataset.item_category of the same files,
    and the user attributes its profiles: one definition online and offline."""
    folder = writer(tmp_path / "ml")
    ds = load_movielens(folder)
    grouplens = (folder / "u.item").exists()
    item_file = folder / ("u.item" if grouplens else "ml-100k.item")
    user_file = folder / ("u.user" if grouplens else "ml-100k.user")
    categories = read_item_categories(item_file)
    in_file = {
        ds.items[i]: ds.item_category(i) for i in range(len(ds.items)) if ds.items[i] in categories
    }
    assert categories == in_file
    assert categories["40"] in ("Film-Noir|Drama", "Drama|Film-Noir")  # the file's order
    assert read_user_attributes(user_file) == ds.users
    assert read_user_attributes(user_file)["1"] == {"age": "24", "gender": "M", "occupation": (
        "technician" if grouplens else "x")}  # fmt: skip


def test_attribute_files_name_the_bad_line(tmp_path: Path) -> None:
    bad = tmp_path / "u.user"
    bad.write_text("1|24|M|technician|85711\n2|53\n")
    with pytest.raises(ConfigError, match=r"u.user:2: expected id\|age"):
        read_user_attributes(bad)
    atomic = tmp_path / "x.user"
    atomic.write_text("user_id:token\tage:token\n1\n")
    with pytest.raises(ConfigError, match=r"x.user:2: expected 2 tab-separated fields"):
        read_user_attributes(atomic)


@pytest.mark.skipif(not (ML100K / "ml-100k.item").exists(), reason="no ml-100k copy here")
def test_ml100k_categories_equal_the_dataset_categories() -> None:
    ds = load_movielens(ML100K)
    categories = read_item_categories(ML100K / "ml-100k.item")
    assert categories == {ds.items[i]: ds.item_category(i) for i in range(len(ds.items))}
    users = read_user_attributes(ML100K / "ml-100k.user")
    assert len(users) == 943 and users == ds.users


def test_both_formats_hash_differently_but_deterministically(tmp_path: Path) -> None:
    a = load_movielens(write_grouplens(tmp_path / "a"))
    b = load_movielens(write_grouplens(tmp_path / "b"))
    c = load_movielens(write_recbole(tmp_path / "c"))
    assert a.sha256 == b.sha256 != c.sha256


def test_missing_data_names_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"ml-100k.inter .* u.data"):
        load_movielens(tmp_path)


def test_order_is_ts_then_event_id(tmp_path: Path) -> None:
    ds = load_movielens(write_grouplens(tmp_path / "ml"))
    order = chronological_order(ds)
    user1 = [int(r) for r in order if ds.user_ids[r] == "1"]
    # ts 100 (row 0), 150 (row 4), then the tie at ts 200: row 1 before row 2, then 300 (row 8)
    assert user1 == [0, 4, 1, 2, 8]


def test_leave_last_out_samples(tmp_path: Path) -> None:
    ds = load_movielens(write_grouplens(tmp_path / "ml"))
    split = build_samples(ds, history_len=2, n_negatives=0, seed=3)
    items = np.asarray(ds.items)
    # user 1: 10, 40, 20, 30, 50 -> train positives at positions 1, 2 (40, 20); valid 30; test 50
    u1_train = split.train.user == "1"
    pos = split.train.label == 1
    assert items[split.train.cand[u1_train & pos]].tolist() == ["40", "20"]
    t = int(np.flatnonzero(split.test.user == "1")[0])
    assert items[split.test.cand[t, 0]] == "50" and split.test.label[t].tolist() == [1.0]
    # test history = the previous 2 events (history_len=2), oldest first, with their event rows
    assert items[split.test.hist[t][split.test.hist_mask[t]]].tolist() == ["20", "30"]
    assert split.test.hist_rows[t].tolist() == [1, 2]
    v = int(np.flatnonzero(split.valid.user == "1")[0])
    assert items[split.valid.cand[v, 0]] == "30"
    # train negatives never come from items the user rated; there is one per positive
    neg = split.train.cand[u1_train & ~pos]
    assert len(neg) == 2 and set(items[neg].tolist()) <= {"60", "70", "80"}
    assert set(items[split.test.cand[t, 1:]].tolist()) == set()  # n_negatives=0
    # popularity counts only train-split events (not valid/test)
    assert split.train_item_counts.sum() == (5 - 2) + (4 - 2)


def test_samples_are_seeded(tmp_path: Path) -> None:
    ds = load_movielens(write_grouplens(tmp_path / "ml"))
    a = build_samples(ds, history_len=3, n_negatives=1, seed=5)
    b = build_samples(ds, history_len=3, n_negatives=1, seed=5)
    np.testing.assert_array_equal(a.test.cand, b.test.cand)
    np.testing.assert_array_equal(a.train.cand, b.train.cand)


@pytest.mark.skipif(
    not (ML100K / "ml-100k.inter").exists(),
    reason=f"MovieLens-100K not found at {ML100K} (set STREAMRANK_DATA_DIR)",
)
def test_real_ml100k_samples() -> None:
    ds = load_movielens(ML100K)
    assert (
        ds.n_events == 100_000 and len(ds.items) == 1682 and len(set(ds.user_ids.tolist())) == 943
    )
    assert len(ds.genres) == 19
    split = build_samples(ds, history_len=50, n_negatives=20, seed=17)
    assert split.test.cand.shape == (943, 21)
    assert split.train.hist.shape[1] == 50
    # negatives: never rated by the user
    rated: dict[str, set[int]] = {}
    for u, i in zip(ds.user_ids.tolist(), ds.item_index.tolist(), strict=True):
        rated.setdefault(u, set()).add(i)
    for u, cands in zip(split.test.user.tolist(), split.test.cand.tolist(), strict=True):
        assert not rated[u] & set(cands[1:]) and len(set(cands)) == 21


def test_too_few_unrated_items_is_a_clear_error(tmp_path: Path) -> None:
    ds = load_movielens(write_grouplens(tmp_path / "ml"))
    with pytest.raises(ConfigError, match="cannot draw 4 unrated negatives"):
        build_samples(ds, history_len=3, n_negatives=4, seed=5)


def test_attributes_bucket_ages_and_code_unknowns_as_zero(tmp_path: Path) -> None:
    from scoring.model.features import FeatureSpec, age_bucket, attribute_codes
    from scoring.training.data import attribute_vocab

    assert [age_bucket(a) for a in ("7", "17", "18", "24", "25", "49", "50", "56", "73", "x")] == [
        "<18", "<18", "18-24", "18-24", "25-34", "45-49", "50-55", "56+", "56+", "unknown",
    ]  # fmt: skip
    # ages that parse as floats but are no age (a corrupt .user file) are unknown, not a crash
    assert [age_bucket(a) for a in ("inf", "-inf", "nan", "")] == ["unknown"] * 4
    ds = load_movielens(write_grouplens(tmp_path / "ml"))
    vocab = attribute_vocab(ds)
    assert list(vocab) == ["age", "gender", "occupation"]
    assert vocab["gender"] == ("F", "M")
    assert vocab["occupation"] == ("other", "technician")
    spec = FeatureSpec(families=("sequence", "attributes"), user_attributes=vocab)
    age = vocab["age"]
    codes = [attribute_codes(spec, ds.users.get(u)) for u in ("1", "2", "3")]
    assert codes[0] == [age.index("18-24") + 1, 2, 2]  # 24, M, technician
    assert codes[1] == [age.index("50-55") + 1, 1, 1]  # 53, F, other
    assert codes[2] == [0, 0, 0]  # user 3 has no attributes
    assert attribute_codes(spec, {"age": "30", "gender": "X"}) == [age.index("25-34") + 1, 0, 0]
