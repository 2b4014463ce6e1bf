"""Byte-exact embedding store keys: published data depends on them, so any change must be deliberate."""

from __future__ import annotations

import fnmatch

from streamrank import keys


def test_embedding_keys_are_byte_exact() -> None:
    assert keys.embedding_meta("din-7", "item") == "sr:emb:din-7:item:meta"
    assert keys.embedding_bucket("din-7", "item", 0) == "sr:emb:din-7:item:0"
    assert keys.embedding_bucket("din-7", "item", 15625) == "sr:emb:din-7:item:15625"
    assert keys.embedding_bucket_prefix("din-7", "item") == "sr:emb:din-7:item:"
    assert keys.embedding_versions() == "sr:emb:versions"
    assert keys.embedding_version_pattern("din-7") == "sr:emb:din-7:*"
    assert keys.embedding_table_pattern("din-7", "item") == "sr:emb:din-7:item:*"
    assert keys.embedding_meta_pattern("din-7") == "sr:emb:din-7:*:meta"


def test_bucket_key_is_prefix_plus_decimal_bucket() -> None:
    # The fetch script builds bucket keys as prefix .. bucket: both spellings must agree.
    for bucket in (0, 7, 123456):
        assert keys.embedding_bucket("v1", "t", bucket) == (
            keys.embedding_bucket_prefix("v1", "t") + str(bucket)
        )


def test_version_pattern_matches_only_its_version() -> None:
    mine = [keys.embedding_meta("v1", "item"), keys.embedding_bucket("v1", "item", 3)]
    others = [
        keys.embedding_meta("v10", "item"),
        keys.embedding_bucket("v1x", "item", 3),
        keys.embedding_versions(),
        keys.active_model(),
    ]
    pattern = keys.embedding_version_pattern("v1")
    assert all(fnmatch.fnmatchcase(k, pattern) for k in mine)
    assert not any(fnmatch.fnmatchcase(k, pattern) for k in others)
    metas = keys.embedding_meta_pattern("v1")
    assert fnmatch.fnmatchcase(keys.embedding_meta("v1", "item"), metas)
    assert not fnmatch.fnmatchcase(keys.embedding_bucket("v1", "item", 3), metas)
