"""Which inter-host algorithm the bundled smddp backend runs: the runtime's own rule
(smddp_sdk/collectives/algorithms.py and the native core use these functions and constants), so the
planner (costmodel.py) predicts what runs. Stdlib only; the algorithms are described in algorithms.py.

AllReduce: the ring once each of its rounds moves at least RING_ROUND_BYTES (H >= 3 hosts), where its
extra rounds cost little and continuous flows pay; otherwise the cheapest by an alpha-beta model in
integer bytes of link time (``allreduce_cost``: rounds of one network latency, ALPHA_BYTES; messages a
host sends or receives, MESSAGE_BYTES; the bytes the busiest host sends). AllGather: the ring for blocks
of RING_ROUND_BYTES and more, else oneshot or bruck by the same model. Broadcast: a binomial tree from the
root's host (ceil(log2 H) rounds of the whole message), or for large messages van de Geijn's scatter
(the same tree, each subtree's shards only) then an all_gather of the shards, whichever the model prices
lower (``broadcast_cost``). The constants are fixed, not
measured per link: the runtime does not know its link, so the planner prices the same choice on the
target's own alpha and bandwidth.
"""

from __future__ import annotations

ALPHA_BYTES = 64 << 10  # a round's network latency in bytes of link time (0.5 ms at 1 Gbit/s, 50 us at 10)
MESSAGE_BYTES = 4 << 10  # a host's work per message it sends or receives (system calls, header)
RING_ROUND_BYTES = 512 << 10  # the ring once its rounds move this much: its latencies cost little then
ROUNDS_FROM_BYTES = 64 << 10  # exchanges at least this large per peer run as permutation rounds
PIPELINE_CHUNK_BYTES = 16 << 20  # per step of the sharded pipeline (SMDDP_PIPELINE_CHUNK_BYTES's default)
ALL_REDUCE_ALGORITHMS = ("oneshot", "recursive_doubling", "sharded", "halving_doubling", "ring")
ALL_GATHER_ALGORITHMS = ("oneshot", "bruck", "ring")
BROADCAST_ALGORITHMS = ("binomial", "scatter_allgather")


def log2_floor(hosts: int) -> int:
    return hosts.bit_length() - 1


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def allreduce_cost(algorithm: str, nbytes: int, hosts: int) -> int:
    """The model's time of an all_reduce of nbytes between hosts, in bytes of link time (integers, so
    that the native core, which mirrors this, decides alike)."""
    log = log2_floor(hosts)
    folded = int(hosts > 1 << log)  # extra hosts fold in first and get the result back after
    if algorithm == "oneshot":
        rounds, messages, moved = 1, 2 * (hosts - 1), (hosts - 1) * nbytes
    elif algorithm == "recursive_doubling":
        rounds, messages, moved = log + 2 * folded, 2 * (log + folded), (log + folded) * nbytes
    elif algorithm == "halving_doubling":
        p = 1 << log
        rounds, messages, moved = 2 * (log + folded), 4 * log + 2 * folded, 2 * (p - 1) * nbytes // p + folded * nbytes
    else:  # sharded and ring: reduce-scatter + all-gather of one shard per host
        per_peer = -(-nbytes // hosts)
        rounds = 2 if algorithm == "sharded" and per_peer < ROUNDS_FROM_BYTES else 2 * (hosts - 1)
        messages, moved = 4 * (hosts - 1), 2 * (hosts - 1) * nbytes // hosts
    return rounds * ALPHA_BYTES + messages * MESSAGE_BYTES + moved


def allreduce_algorithm(nbytes: int, hosts: int, forced: str = "auto") -> str:
    """The all_reduce algorithm between hosts: the forced one, the ring for large buffers, else the
    cheapest by the model (ties: the earlier of oneshot, recursive_doubling, sharded, halving_doubling)."""
    if forced != "auto":
        return forced
    if hosts >= 3 and nbytes // hosts >= RING_ROUND_BYTES:
        return "ring"
    return min(ALL_REDUCE_ALGORITHMS[:4], key=lambda algorithm: allreduce_cost(algorithm, nbytes, hosts))


def ceil_log2(hosts: int) -> int:
    return (hosts - 1).bit_length()


def allgather_cost(algorithm: str, block_bytes: int, hosts: int) -> int:
    """The model's time of an all_gather of blocks of block_bytes between hosts, in bytes of link time."""
    if algorithm == "oneshot":
        rounds = 1 if block_bytes < ROUNDS_FROM_BYTES else hosts - 1
        latency = rounds * ALPHA_BYTES + 2 * (hosts - 1) * MESSAGE_BYTES
    else:  # bruck and the ring: one message each way per round
        latency = (ceil_log2(hosts) if algorithm == "bruck" else hosts - 1) * (ALPHA_BYTES + 2 * MESSAGE_BYTES)
    return latency + (hosts - 1) * block_bytes


def allgather_algorithm(block_bytes: int, hosts: int) -> str:
    """The all_gather algorithm between hosts for blocks of up to block_bytes: the ring for large blocks,
    else oneshot or bruck by the model (ties: oneshot)."""
    if hosts >= 3 and block_bytes >= RING_ROUND_BYTES:
        return "ring"
    return min(("oneshot", "bruck"), key=lambda algorithm: allgather_cost(algorithm, block_bytes, hosts))


def broadcast_cost(algorithm: str, nbytes: int, hosts: int) -> int:
    """The model's time of a broadcast of nbytes between hosts, in bytes of link time: the tree's rounds
    carry the whole message (binomial) or the shards of the receiver's subtree (scatter_allgather, at most
    (H-1)/H of it on the root's link), then the all_gather of the shards."""
    rounds = ceil_log2(hosts) * (ALPHA_BYTES + 2 * MESSAGE_BYTES)
    if algorithm == "binomial":
        return rounds + ceil_log2(hosts) * nbytes
    block = -(-nbytes // hosts)
    return rounds + (hosts - 1) * block + allgather_cost(allgather_algorithm(block, hosts), block, hosts)


def broadcast_algorithm(nbytes: int, hosts: int) -> str:
    """The broadcast algorithm between hosts: the cheaper by the model (ties: binomial)."""
    return min(BROADCAST_ALGORITHMS, key=lambda algorithm: broadcast_cost(algorithm, nbytes, hosts))


def inter_host_algorithm(op: str, nbytes: int, hosts: int, forced: str = "auto") -> str:
    """The planner's question: the algorithm for ``op`` of ``nbytes`` (all_gather: the gathered output)
    between ``hosts`` hosts, ``forced`` unless "auto"."""
    if forced != "auto":
        return forced
    if op == "all_reduce":
        return allreduce_algorithm(nbytes, hosts)
    if op == "all_gather":
        return allgather_algorithm(-(-nbytes // hosts), hosts)
    if op == "broadcast":
        return broadcast_algorithm(nbytes, hosts)
    raise ValueError(f"no inter-host algorithm rules for {op!r}: choose from all_reduce, all_gather, broadcast")
