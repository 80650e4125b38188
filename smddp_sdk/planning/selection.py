"""Which inter-host algorithm the bundled smddp backend runs for a collective: one rule table for the
runtime (smddp_sdk/collectives/algorithms.py) and the planner (costmodel.py). Stdlib only.

Rules are tried in order; the first whose algorithm the runtime implements and whose condition holds on
(bytes, hosts) wins. With only oneshot, sharded and ring implemented they give the runtime's choice as it
was before the log-depth algorithms; each algorithm added to IMPLEMENTED takes its place ahead of them.
S is the collective's bytes (all_gather: the gathered output), H the number of hosts.

all_reduce
    oneshot             H = 2                 one round; with two hosts it moves the optimal bytes
    recursive_doubling  S ≤ 64 KiB            ⌈log2 H⌉ rounds of S: fewest rounds when latency dominates
    oneshot             S ≤ 32 KiB            one round of (H-1)·S per link
    halving_doubling    S < 1 MiB, or H a power of two: 2·log2 H rounds, optimal bytes (Rabenseifner);
                                              other H pay two extra rounds of S to fold the extra hosts in
    sharded             S < 1 MiB             pipelined reduce-scatter + all-gather, all-to-all rounds
    ring                otherwise             2(H-1) rounds, optimal bytes, one continuous flow per link
all_gather
    oneshot             H = 2
    bruck               S ≤ 256 KiB           ⌈log2 H⌉ rounds, optimal bytes, any H
    oneshot             S/H < 1 MiB           all-to-all (in permutation rounds)
    ring                otherwise
"""

from __future__ import annotations

from collections.abc import Callable

KIB, MIB = 1 << 10, 1 << 20
ONESHOT_UPTO = 32 * KIB
RECURSIVE_DOUBLING_UPTO = 64 * KIB
RING_FROM = 1 * MIB
BRUCK_UPTO = 256 * KIB
PIPELINE_CHUNK = 16 * MIB  # the sharded pipeline's step (SMDDP_PIPELINE_CHUNK_BYTES's default)

# The algorithms the runtime implements; the runtime's owner adds a name here when its algorithm lands.
IMPLEMENTED = frozenset({"oneshot", "sharded", "ring"})
ALL_REDUCE_ALGORITHMS = ("oneshot", "recursive_doubling", "halving_doubling", "sharded", "ring")
ALL_GATHER_ALGORITHMS = ("oneshot", "bruck", "ring")

Condition = Callable[[int, int], bool]  # (bytes, hosts) -> applies


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


RULES: dict[str, tuple[tuple[str, Condition], ...]] = {
    "all_reduce": (
        ("oneshot", lambda s, h: h == 2),
        ("recursive_doubling", lambda s, h: s <= RECURSIVE_DOUBLING_UPTO),
        ("oneshot", lambda s, h: s <= ONESHOT_UPTO),
        ("halving_doubling", lambda s, h: s < RING_FROM or is_power_of_two(h)),
        ("sharded", lambda s, h: s < RING_FROM),
        ("ring", lambda s, h: True),
    ),
    "all_gather": (
        ("oneshot", lambda s, h: h == 2),
        ("bruck", lambda s, h: s <= BRUCK_UPTO),
        ("oneshot", lambda s, h: s / h < RING_FROM),
        ("ring", lambda s, h: True),
    ),
}


def inter_host_algorithm(op: str, nbytes: int, hosts: int, forced: str = "auto", implemented: frozenset[str] = IMPLEMENTED) -> str:
    """The algorithm for ``op`` of ``nbytes`` between ``hosts`` hosts (``forced`` unless "auto")."""
    if forced != "auto":
        return forced
    if op not in RULES:
        raise ValueError(f"no inter-host algorithm rules for {op!r}: choose from {', '.join(RULES)}")
    return next(name for name, applies in RULES[op] if name in implemented and applies(nbytes, hosts))
