"""The scoring worker's GC-pause hook, wrapped out of torch.compile's tracing, still observes
every collection, also those that run inside a compiled forward, and is removed as installed."""

import gc

import torch

from scoring.model.runtimes import untraced
from streamrank.runtime.loop_health import GcPauses


def test_the_untraced_hook_observes_collections_inside_a_compiled_call() -> None:
    seen: list[int] = []
    hook = GcPauses(lambda generation, _: seen.append(generation))
    # Dynamo traces the frames (what the hook must be kept out of); no inductor needed
    compiled = torch.compile(lambda x: (x @ x.T).relu().sum(-1), backend="eager")
    threshold = gc.get_threshold()
    hook.install(untraced)
    try:
        gc.set_threshold(1, 1, 1)  # a collection nearly every allocation: during the calls too
        for n in range(20):
            compiled(torch.ones(3 + n % 3, 4))
        gc.collect(2)
    finally:
        gc.set_threshold(*threshold)
        hook.remove()
    assert 2 in seen and len(seen) > 20
    assert not any(getattr(cb, "__wrapped__", None) is hook for cb in gc.callbacks)
    before = len(seen)
    gc.collect(2)
    assert len(seen) == before  # removed: no longer observed
