"""The GEMM floor records exactly the matrix products a forward makes, with their flops."""

from __future__ import annotations

import torch

from workbench.bench.gemm_floor import record_products, replay


def test_records_each_product_with_its_flops_and_nothing_else() -> None:
    a, b = torch.randn(5, 3), torch.randn(3, 4)  # mm: 2*5*3*4 = 120
    x, y = torch.randn(2, 5, 3), torch.randn(2, 3, 6)  # bmm: 2*2*5*3*6 = 360
    lin = torch.nn.Linear(3, 7)  # addmm on [5, 3]: 2*5*3*7 = 210

    def forward() -> torch.Tensor:
        return (a @ b).sum() + torch.relu(x @ y).sum() + lin(a).sum()

    calls = record_products(forward)
    names = [c.op.overloadpacket.__name__ for c in calls]
    assert names == ["mm", "bmm", "addmm"]
    assert [c.flops for c in calls] == [120, 360, 210]


def test_replay_runs_the_recorded_products_on_copies() -> None:
    a, b = torch.randn(4, 2), torch.randn(2, 3)
    calls = record_products(lambda: a @ b)
    a.fill_(float("nan"))  # the recording holds copies: later changes do not reach it
    (call,) = calls
    assert torch.isfinite(call.op(*call.args, **call.kwargs)).all()
    replay(calls)()  # runs without the forward around it
