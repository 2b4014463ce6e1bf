"""Batch assembly: the union lookup, padding and masks, and that gather puts rows back in place."""

from __future__ import annotations

import numpy as np

from scoring.serving.assemble import assemble, gather, split_scores


def test_union_is_looked_up_once_and_indices_point_at_the_right_rows() -> None:
    batch = assemble(
        [["h1", "h2", "a"], []],
        [["a", "b"], ["b", "c", "a"]],
        max_history=50,
    )
    assert sorted(batch.unique_ids) == ["a", "b", "c", "h1", "h2"]
    assert len(set(batch.unique_ids)) == len(batch.unique_ids)
    ids = np.array(batch.unique_ids)
    assert ids[batch.cand_index[0, :2]].tolist() == ["a", "b"]
    assert ids[batch.cand_index[1]].tolist() == ["b", "c", "a"]
    assert batch.cand_mask.tolist() == [[True, True, False], [True, True, True]]
    assert ids[batch.hist_index[0]].tolist() == ["h1", "h2", "a"]
    assert batch.hist_mask.tolist() == [[True, True, True], [False, False, False]]


def test_history_keeps_the_newest_events() -> None:
    batch = assemble([["e1", "e2", "e3", "e4"]], [["x"]], max_history=2)
    ids = np.array(batch.unique_ids)
    assert ids[batch.hist_index[0]].tolist() == ["e3", "e4"]


def test_cold_start_batch_has_one_fully_masked_history_slot() -> None:
    batch = assemble([[], []], [["x"], ["y", "x"]], max_history=50)
    assert batch.hist_mask.shape == (2, 1)
    assert not batch.hist_mask.any()


def test_gather_returns_each_ids_row_and_zero_padding() -> None:
    batch = assemble([["h"]], [["a", "b"]], max_history=5)
    rows = np.stack([np.full(3, float(ord(i[0])), dtype=np.float32) for i in batch.unique_ids])
    hist, cands = gather(rows, batch)
    assert hist.shape == (1, 1, 3) and cands.shape == (1, 2, 3)
    assert hist[0, 0].tolist() == [ord("h")] * 3
    assert cands[0, 1].tolist() == [ord("b")] * 3
    batch2 = assemble([["h"], []], [["a"], ["b", "a"]], max_history=5)
    rows2 = np.stack([np.full(3, float(ord(i[0])), dtype=np.float32) for i in batch2.unique_ids])
    hist2, cands2 = gather(rows2, batch2)
    assert cands2[0, 1].tolist() == [0.0, 0.0, 0.0]  # padding slot
    assert hist2[1, 0].tolist() == [0.0, 0.0, 0.0]


def test_split_scores_drops_padding_and_keeps_item_order() -> None:
    batch = assemble([[], []], [["a"], ["b", "c"]], max_history=5)
    scores = np.array([[0.1, 0.9], [0.2, 0.3]], dtype=np.float32)
    out = split_scores(scores, batch)
    assert np.allclose(out[0], [0.1]) and np.allclose(out[1], [0.2, 0.3])
