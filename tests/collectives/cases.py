"""Collective test cases run inside every rank: deterministic inputs, a local reference, a comparison.

A case is a JSON dict (so the test process can drive the ranks through the store). Every rank can build
every other rank's input from (seed, rank), so each checks its own result against a reference computed
locally, without trusting the backend under test.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "bool": torch.bool,
}
REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR,
}
REDUCING = {"all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor",
            "funcol_all_reduce", "funcol_reduce_scatter"}
OPS = sorted(REDUCING | {"all_gather", "all_gather_into_tensor", "broadcast", "barrier", "all_to_all",
                         "all_to_all_single", "gather", "scatter", "funcol_all_gather"})


def make_input(seed: int, key: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Small integer-valued data (halves for floats), so sums and products are exact in every dtype."""
    gen = torch.Generator().manual_seed(seed * 7919 + key)
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=gen).bool()
    low = 0 if dtype == torch.uint8 else -3
    values = torch.randint(low, 4, tuple(shape), generator=gen)
    if dtype.is_floating_point:
        return (values.double() / 2).to(dtype)
    return values.to(dtype)


def reference_reduce(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    dtype = tensors[0].dtype
    wide = torch.stack([t.double() if dtype.is_floating_point else t.long() for t in tensors])
    if op in ("sum", "avg"):
        out = wide.sum(0)
        if op == "avg":
            out = out / len(tensors) if dtype.is_floating_point else torch.div(out, len(tensors), rounding_mode="floor")
    elif op == "product":
        out = wide.prod(0)
    elif op == "min":
        out = wide.min(0).values
    elif op == "max":
        out = wide.max(0).values
    else:
        out = wide[0]
        fn = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op]
        for t in wide[1:]:
            out = fn(out, t)
    return out.to(dtype)


def _maybe_strided(tensor: torch.Tensor, strided: bool) -> torch.Tensor:
    """The same values in a non-contiguous tensor (every other element of a wider one)."""
    if not strided or tensor.dim() == 0:
        return tensor
    wide = torch.zeros(*tensor.shape[:-1], tensor.shape[-1] * 2, dtype=tensor.dtype)
    view = wide[..., ::2]
    view.copy_(tensor)
    return view if tensor.shape[-1] > 1 else view


def _check(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if expected.dtype in (torch.float16, torch.bfloat16):
        torch.testing.assert_close(actual, expected, rtol=1e-2, atol=1e-2, msg=lambda m: f"{what}: {m}")
    else:
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6, msg=lambda m: f"{what}: {m}")


def _wait(result: object, case: dict) -> None:
    if case.get("async") and result is not None:
        result.wait()


class CaseRunner:
    """Runs cases on one rank; groups[i] is the subgroup for case["group"] == i (None: not a member)."""

    def __init__(self, groups: Sequence[tuple[list[int], dist.ProcessGroup | None]]) -> None:
        self.groups = groups

    def run(self, case: dict) -> str:
        ranks, group = self.groups[case["group"]]
        if group is None:
            return "skip"
        try:
            getattr(self, "_" + case["op"])(case, ranks, group, ranks.index(dist.get_rank()))
        except Exception:  # noqa: BLE001 - reported to the test process
            return f"rank {dist.get_rank()} failed {case}:\n{traceback.format_exc()}"
        return "ok"

    # helpers --------------------------------------------------------------------------------------------
    @staticmethod
    def _x(case: dict, key: int, shape: Sequence[int] | None = None) -> torch.Tensor:
        return make_input(case["seed"], key, case["shape"] if shape is None else shape, DTYPES[case["dtype"]])

    @staticmethod
    def _kw(case: dict, group: dist.ProcessGroup) -> dict:
        return {"group": group, "async_op": bool(case.get("async"))}

    # reducing ops -----------------------------------------------------------------------------------
    def _all_reduce(self, case, ranks, group, me):
        t = _maybe_strided(self._x(case, me), case.get("strided", False))
        _wait(dist.all_reduce(t, REDUCE_OPS[case["reduce_op"]], **self._kw(case, group)), case)
        _check(t, reference_reduce([self._x(case, i) for i in range(len(ranks))], case["reduce_op"]), "all_reduce")

    def _all_reduce_rounding(self, case, ranks, group, me):
        """fp16/bf16 sums of random values: exactly the fp32 sum rounded once, whatever the layout."""
        def x(i):
            return torch.randn(tuple(case["shape"]), generator=torch.Generator().manual_seed(case["seed"] + i)).to(DTYPES[case["dtype"]])
        t = x(me)
        _wait(dist.all_reduce(t, REDUCE_OPS[case["reduce_op"]], **self._kw(case, group)), case)
        wide = sum(x(i).float() for i in range(len(ranks)))
        if case["reduce_op"] == "avg":
            wide = wide / len(ranks)
        expected = wide.to(t.dtype)
        # fp32 sums in another order may differ in the last fp32 bit, which flips a rounding very rarely;
        # rounding twice (per host, then between hosts) changes about a third of the elements
        differ = int((t != expected).sum())
        assert differ <= t.numel() // 1000, f"all_reduce_rounding: {differ} of {t.numel()} elements differ"

    def _all_reduce_coalesced(self, case, ranks, group, me):
        ts = [self._x(case, me * 2 + k) for k in range(2)]
        _wait(dist.all_reduce_coalesced(ts, REDUCE_OPS[case["reduce_op"]], **self._kw(case, group)), case)
        for k, t in enumerate(ts):
            _check(t, reference_reduce([self._x(case, i * 2 + k) for i in range(len(ranks))], case["reduce_op"]), "all_reduce_coalesced")

    def _reduce(self, case, ranks, group, me):
        root = case["root"] % len(ranks)
        t = _maybe_strided(self._x(case, me), case.get("strided", False))
        _wait(dist.reduce(t, dst=ranks[root], op=REDUCE_OPS[case["reduce_op"]], **self._kw(case, group)), case)
        if me == root:
            _check(t, reference_reduce([self._x(case, i) for i in range(len(ranks))], case["reduce_op"]), "reduce")

    def _reduce_scatter(self, case, ranks, group, me):
        n = len(ranks)
        out = torch.empty(case["shape"], dtype=DTYPES[case["dtype"]])
        ins = [self._x(case, me * 16 + j) for j in range(n)]
        _wait(dist.reduce_scatter(out, ins, REDUCE_OPS[case["reduce_op"]], **self._kw(case, group)), case)
        _check(out, reference_reduce([self._x(case, i * 16 + me) for i in range(n)], case["reduce_op"]), "reduce_scatter")

    def _reduce_scatter_tensor(self, case, ranks, group, me):
        n = len(ranks)
        shape = [n, *case["shape"]]
        out = torch.empty(case["shape"], dtype=DTYPES[case["dtype"]])
        _wait(dist.reduce_scatter_single(out, self._x(case, me, shape), REDUCE_OPS[case["reduce_op"]], **self._kw(case, group)), case)
        _check(out, reference_reduce([self._x(case, i, shape)[me] for i in range(n)], case["reduce_op"]), "reduce_scatter_tensor")

    def _funcol_all_reduce(self, case, ranks, group, me):
        out = funcol.all_reduce(self._x(case, me), case["reduce_op"], group)
        _check(funcol.wait_tensor(out), reference_reduce([self._x(case, i) for i in range(len(ranks))], case["reduce_op"]), "funcol.all_reduce")

    def _funcol_reduce_scatter(self, case, ranks, group, me):
        n = len(ranks)
        shape = [n * max(1, case["shape"][0] if case["shape"] else 1), *case["shape"][1:]]
        out = funcol.wait_tensor(funcol.reduce_scatter_tensor(self._x(case, me, shape), case["reduce_op"], 0, group))
        expected = reference_reduce([self._x(case, i, shape).chunk(n)[me] for i in range(n)], case["reduce_op"])
        _check(out, expected, "funcol.reduce_scatter_tensor")

    # data movement ----------------------------------------------------------------------------------
    def _all_gather(self, case, ranks, group, me):
        outs = [torch.empty(case["shape"], dtype=DTYPES[case["dtype"]]) for _ in ranks]
        _wait(dist.all_gather(outs, _maybe_strided(self._x(case, me), case.get("strided", False)), **self._kw(case, group)), case)
        for i, out in enumerate(outs):
            _check(out, self._x(case, i), "all_gather")

    def _all_gather_into_tensor(self, case, ranks, group, me):
        out = torch.empty([len(ranks), *case["shape"]], dtype=DTYPES[case["dtype"]])
        _wait(dist.all_gather_single(out, _maybe_strided(self._x(case, me), case.get("strided", False)), **self._kw(case, group)), case)
        _check(out, torch.stack([self._x(case, i) for i in range(len(ranks))]), "all_gather_into_tensor")

    def _funcol_all_gather(self, case, ranks, group, me):
        out = funcol.wait_tensor(funcol.all_gather_tensor(self._x(case, me).reshape(-1), 0, group))
        _check(out, torch.cat([self._x(case, i).reshape(-1) for i in range(len(ranks))]), "funcol.all_gather_tensor")

    def _broadcast(self, case, ranks, group, me):
        root = case["root"] % len(ranks)
        t = _maybe_strided(self._x(case, me), case.get("strided", False))
        _wait(dist.broadcast(t, src=ranks[root], **self._kw(case, group)), case)
        _check(t, self._x(case, root), "broadcast")

    def _barrier(self, case, ranks, group, me):
        _wait(dist.barrier(**self._kw(case, group)), case)

    def _gather(self, case, ranks, group, me):
        root = case["root"] % len(ranks)
        outs = [torch.empty(case["shape"], dtype=DTYPES[case["dtype"]]) for _ in ranks] if me == root else None
        _wait(dist.gather(self._x(case, me), outs, dst=ranks[root], **self._kw(case, group)), case)
        if me == root:
            for i, out in enumerate(outs):
                _check(out, self._x(case, i), "gather")

    def _scatter(self, case, ranks, group, me):
        root = case["root"] % len(ranks)
        out = torch.empty(case["shape"], dtype=DTYPES[case["dtype"]])
        parts = [self._x(case, root * 16 + j) for j in range(len(ranks))] if me == root else None
        _wait(dist.scatter(out, parts, src=ranks[root], **self._kw(case, group)), case)
        _check(out, self._x(case, root * 16 + me), "scatter")

    @staticmethod
    def _rows(case: dict, src: int, dst: int) -> int:
        return (case["seed"] + src + 2 * dst) % 3

    def _part(self, case, src, dst):
        return self._x(case, src * 16 + dst, [self._rows(case, src, dst), *case["shape"][1:]])

    def _all_to_all(self, case, ranks, group, me):
        n = len(ranks)
        outs = [torch.empty([self._rows(case, j, me), *case["shape"][1:]], dtype=DTYPES[case["dtype"]]) for j in range(n)]
        _wait(dist.all_to_all(outs, [self._part(case, me, j) for j in range(n)], **self._kw(case, group)), case)
        for j, out in enumerate(outs):
            _check(out, self._part(case, j, me), "all_to_all")

    def _all_to_all_single(self, case, ranks, group, me):
        n = len(ranks)
        send = torch.cat([self._part(case, me, j) for j in range(n)])
        out_rows = [self._rows(case, j, me) for j in range(n)]
        out = torch.empty([sum(out_rows), *case["shape"][1:]], dtype=DTYPES[case["dtype"]])
        in_rows = [self._rows(case, me, j) for j in range(n)]
        _wait(dist.all_to_all_single(out, send, out_rows, in_rows, **self._kw(case, group)), case)
        _check(out, torch.cat([self._part(case, j, me) for j in range(n)]), "all_to_all_single")
