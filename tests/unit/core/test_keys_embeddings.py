"""Byte-exact embedding store keys: published data depends on them, so any change must be deliberate."""

from __future__ import annotations

import fnmatch

from redis.crc import key_slot

from streamrank import keys


def test_embedding_keys_are_byte_exact() -> None:
    assert keys.embedding_meta("din-7", "item") == "sr:{emb:din-7:item}:meta"
    assert keys.embedding_bucket("din-7", "item", 0, 16) == "sr:{emb:din-7:item:0}:0"
    assert keys.embedding_bucket("din-7", "item", 15625, 16) == "sr:{emb:din-7:item:9}:15625"
    assert keys.embedding_publish_id("din-7", "item", 9) == "sr:{emb:din-7:item:9}:pid"
    assert keys.embedding_shard_tag("din-7", "item", 9) == "{emb:din-7:item:9}"
    assert keys.embedding_versions() == "sr:{emb}:versions"
    assert keys.embedding_version_pattern("din-7") == "sr:{emb:din-7:*"
    assert keys.embedding_table_pattern("din-7", "item") == "sr:{emb:din-7:item[:}]*"
    assert keys.embedding_meta_pattern("din-7") == "sr:{emb:din-7:*}:meta"
    assert keys.embedding_publish_id_pattern("din-7") == "sr:{emb:din-7:*}:pid"


def test_a_shards_buckets_and_publish_id_share_a_slot() -> None:
    for bucket in (0, 7, 16, 123456):
        shard = keys.embedding_shard(bucket, 16)
        assert shard == bucket % 16
        home = key_slot(keys.embedding_publish_id("v1", "t", shard).encode())
        assert key_slot(keys.embedding_bucket("v1", "t", bucket, 16).encode()) == home


def test_version_pattern_matches_only_its_version() -> None:
    mine = [
        keys.embedding_meta("v1", "item"),
        keys.embedding_bucket("v1", "item", 3, 16),
        keys.embedding_publish_id("v1", "item", 3),
    ]
    others = [
        keys.embedding_meta("v10", "item"),
        keys.embedding_bucket("v1x", "item", 3, 16),
        keys.embedding_versions(),
        keys.active_model(),
    ]
    pattern = keys.embedding_version_pattern("v1")
    assert all(fnmatch.fnmatchcase(k, pattern) for k in mine)
    assert not any(fnmatch.fnmatchcase(k, pattern) for k in others)
    metas = keys.embedding_meta_pattern("v1")
    assert fnmatch.fnmatchcase(keys.embedding_meta("v1", "item"), metas)
    assert not fnmatch.fnmatchcase(keys.embedding_bucket("v1", "item", 3, 16), metas)
    assert not fnmatch.fnmatchcase(keys.embedding_publish_id("v1", "item", 3), metas)
    pids = keys.embedding_publish_id_pattern("v1")
    assert fnmatch.fnmatchcase(keys.embedding_publish_id("v1", "item", 3), pids)
    assert not fnmatch.fnmatchcase(keys.embedding_meta("v1", "item"), pids)


def test_table_pattern_matches_only_its_table() -> None:
    pattern = keys.embedding_table_pattern("v1", "item")
    mine = [
        keys.embedding_meta("v1", "item"),
        keys.embedding_bucket("v1", "item", 3, 16),
        keys.embedding_publish_id("v1", "item", 3),
    ]
    others = [keys.embedding_meta("v1", "items"), keys.embedding_bucket("v1", "item2", 3, 16)]
    assert all(fnmatch.fnmatchcase(k, pattern) for k in mine)
    assert not any(fnmatch.fnmatchcase(k, pattern) for k in others)
