"""Byte-exact keys of the model registry (publish/activate)."""

from redis.crc import key_slot

from streamrank import keys


def test_model_keys_are_byte_exact() -> None:
    assert keys.model_dense("din-20261129-ab12cd") == "sr:{model:din-20261129-ab12cd}:dense"
    assert keys.model_graph("din-20261129-ab12cd") == "sr:{model:din-20261129-ab12cd}:onnx"
    assert keys.model_config("din-20261129-ab12cd") == "sr:{model:din-20261129-ab12cd}:config"
    assert keys.active_model() == "sr:{model}:active"
    assert keys.model_split() == "sr:{model}:split"


def test_model_keys_do_not_collide_with_the_pointer_keys() -> None:
    # a version named like a pointer key still gets its own keys
    assert keys.model_config("active") != keys.active_model()
    assert keys.model_dense("split") != keys.model_split()


def test_keys_read_together_share_a_slot() -> None:
    # one MGET reads the pointer and the split; one MGET a version's config and weights
    assert key_slot(keys.active_model().encode()) == key_slot(keys.model_split().encode())
    for version in ("din-1", "v1.2_x"):
        config, dense = keys.model_config(version).encode(), keys.model_dense(version).encode()
        assert key_slot(config) == key_slot(dense)
