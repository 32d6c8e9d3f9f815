"""The arena planner: no overlap among live tensors, alignment, the lower bound, strategy choice."""

import itertools

import numpy as np
import pytest

from ctxrt.errors import PlanError
from ctxrt.planner.arena import Allocation, Plan, Request, check, lower_bound, plan


def test_lower_bound_of_a_chain_is_the_largest_adjacent_pair() -> None:
    # a -> b -> c -> d: at each step the input and output are live together.
    rs = [Request("a", 64, 0, 1), Request("b", 256, 1, 2), Request("c", 128, 2, 3), Request("d", 64, 3, 3)]
    assert lower_bound(rs) == 256 + 128


def test_lower_bound_counts_everything_live_at_one_step() -> None:
    rs = [Request("skip", 100, 0, 5), Request("x", 50, 1, 2), Request("y", 70, 2, 3), Request("z", 10, 4, 5)]
    assert lower_bound(rs) == 100 + 50 + 70


def test_chain_reaches_the_lower_bound_and_reuses_memory() -> None:
    rs = [Request(f"t{i}", 256 if i % 4 == 1 else 64, i, i + 1) for i in range(20)]
    p = plan(rs)
    check(p, 64)
    assert p.size == p.lower_bound == 256 + 64


def test_random_interval_sets_never_overlap_and_stay_near_the_bound() -> None:
    rng = np.random.default_rng(1)
    for _ in range(30):
        rs = []
        for i in range(60):
            first = int(rng.integers(0, 40))
            rs.append(Request(f"r{i}", 64 * int(rng.integers(1, 50)), first, first + int(rng.integers(0, 6))))
        p = plan(rs)
        check(p, 64)
        assert p.lower_bound <= p.size <= 1.6 * p.lower_bound
        for a, b in itertools.combinations(p.allocations.values(), 2):
            live_together = a.first <= b.last and b.first <= a.last
            apart = a.offset + a.size <= b.offset or b.offset + b.size <= a.offset
            assert apart or not live_together


def test_check_rejects_overlap_and_misalignment() -> None:
    bad = Plan({"a": Allocation("a", 0, 128, 0, 2), "b": Allocation("b", 64, 64, 1, 1)}, 128, 0, "x")
    with pytest.raises(PlanError, match="overlap"):
        check(bad, 64)
    with pytest.raises(PlanError, match="aligned"):
        check(Plan({"a": Allocation("a", 8, 64, 0, 0)}, 72, 0, "x"), 64)


def test_bad_requests_are_refused() -> None:
    with pytest.raises(PlanError):
        plan([Request("a", 64, 3, 1)])
    with pytest.raises(PlanError):
        plan([Request("a", 64, 0, 1), Request("a", 64, 2, 3)])


def test_perturbed_restarts_never_make_the_plan_worse() -> None:
    import ctxrt.planner.arena as arena

    rng = np.random.default_rng(7)
    rs = []
    for i in range(80):
        first = int(rng.integers(0, 50))
        rs.append(Request(f"r{i}", 64 * int(rng.integers(1, 80)), first, first + int(rng.integers(0, 8))))
    saved = arena.RESTARTS
    try:
        arena.RESTARTS = 0
        base = plan(rs)
        arena.RESTARTS = 12
        improved = plan(rs)
    finally:
        arena.RESTARTS = saved
    check(improved, 64)
    assert improved.lower_bound <= improved.size <= base.size
