"""Byte-exact keys of the model registry (publish/activate)."""

from streamrank import keys


def test_model_keys_are_byte_exact() -> None:
    assert keys.model_dense("din-20261129-ab12cd") == "sr:model:din-20261129-ab12cd:dense"
    assert keys.model_config("din-20261129-ab12cd") == "sr:model:din-20261129-ab12cd:config"
    assert keys.active_model() == "sr:model:active"


def test_model_keys_do_not_collide_with_the_pointer_keys() -> None:
    # a version named like a pointer key still gets its own keys
    assert keys.model_config("active") != keys.active_model()
    assert keys.model_dense("split") != keys.model_split()
