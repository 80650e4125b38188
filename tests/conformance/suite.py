"""What the conformance suite runs: the configurations, the tests of torch's distributed_test.py, and the skip list.

SUBSET is every CPU test of torch 2.13's distributed_test.py that gloo passes at world size 4 on one host,
plus the all_to_all tests torch gates on MPI (gloo has no CPU all_to_all; smddp has). Left out: tests that
need CUDA or NCCL, tests torch itself skips below world size 8 (``skip_if_small_worldsize``) or marks
broken, and ones gloo does not pass here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Config:
    world_size: int
    tests: tuple[str, ...]  # run in this configuration, on gloo (where it has the world size) and smddp
    env: dict[str, str] = field(default_factory=dict)
    ranks_per_host: int = 0  # simulated hosts (SM_CURRENT_HOST) of this many ranks; 0: one host


COLLECTIVES = (
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_sum_complex", "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_product", "test_all_reduce_min", "test_all_reduce_max",
    "test_all_reduce_full_group_sum", "test_all_reduce_full_group_product", "test_all_reduce_full_group_min", "test_all_reduce_full_group_max",
    "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_product", "test_all_reduce_coalesced_min", "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_full_group_sum", "test_all_reduce_coalesced_full_group_product",
    "test_all_reduce_coalesced_full_group_min", "test_all_reduce_coalesced_full_group_max", "test_all_reduce_coalesced_max_complex_unsupported",
    "test_sparse_all_reduce_sum",
    "test_reduce_sum", "test_reduce_product", "test_reduce_min", "test_reduce_max", "test_reduce_sum_twice",
    "test_reduce_full_group_sum", "test_reduce_full_group_product", "test_reduce_full_group_min", "test_reduce_full_group_max",
    "test_broadcast", "test_broadcast_full_group",
    "test_scatter", "test_scatter_checks", "test_scatter_complex", "test_scatter_full_group",
    "test_gather", "test_gather_checks", "test_gather_full_group",
    "test_all_gather", "test_all_gather_complex", "test_all_gather_full_group",
    "test_all_gather_coalesced_simple", "test_all_gather_coalesced_complex", "test_all_gather_coalesced_full_group",
    "test_all_gather_coalesced_with_empty",
    "test_barrier", "test_barrier_full_group", "test_barrier_timeout_global", "test_barrier_timeout_full_group",
    "test_monitored_barrier_gloo", "test_monitored_barrier_gloo_subgroup", "test_monitored_barrier_gloo_rank_0_timeout",
)
ALL_TO_ALL = (  # gated on MPI by torch: gloo skips them, smddp runs them
    "test_all_to_all", "test_all_to_all_complex", "test_all_to_all_full_group",
    "test_all_to_all_single_equal_split", "test_all_to_all_single_equal_split_complex", "test_all_to_all_single_equal_split_full_group",
    "test_all_to_all_single_unequal_split", "test_all_to_all_single_unequal_split_complex", "test_all_to_all_single_unequal_split_full_group",
)
POINT_TO_POINT = (
    "test_send_recv", "test_send_recv_autograd_profiler", "test_send_recv_torch_profiler",
    "test_send_recv_any_source", "test_send_recv_any_source_autograd_profiler", "test_send_recv_any_source_torch_profiler",
    "test_send_recv_with_tag", "test_send_recv_with_tag_autograd_profiler", "test_send_recv_with_tag_torch_profiler",
    "test_isend", "test_isend_autograd_profiler", "test_isend_torch_profiler", "test_irecv",
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
)
GROUPS_AND_OBJECTS = (
    "test_get_rank", "test_get_backend", "test_Backend_enum_class", "test_destroy_group", "test_destroy_full_group",
    "test_get_rank_size_group", "test_get_rank_size_full_group", "test_new_subgroups_with_group_param",
    "test_all_gather_object_default_pg", "test_all_gather_object_subgroup", "test_gather_object", "test_gather_object_subgroup",
    "test_scatter_object_list", "test_dump_DDP_relevant_env_vars",
)
DDP = (
    "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view", "test_DistributedDataParallel_requires_grad",
    "test_accumulate_gradients_no_sync", "test_accumulate_gradients_no_sync_grad_is_view",
    "test_accumulate_gradients_no_sync_allreduce_hook", "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_ddp_create_graph", "test_ddp_logging_data_cpu", "test_static_graph_api_cpu", "test_get_future",
    "test_grads_same_across_ranks_with_no_sync",
)
SUBSET = COLLECTIVES + ALL_TO_ALL + POINT_TO_POINT + GROUPS_AND_OBJECTS + DDP
# What the transports change: each collective once (one reduce op each), timeouts, all_to_all, DDP training.
TRANSPORT = (
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_sum_complex", "test_all_reduce_max",
    "test_all_reduce_full_group_sum", "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_full_group_max",
    "test_sparse_all_reduce_sum", "test_reduce_sum", "test_reduce_sum_twice", "test_reduce_full_group_max",
    "test_broadcast", "test_broadcast_full_group", "test_scatter", "test_scatter_full_group", "test_gather", "test_gather_full_group",
    "test_all_gather", "test_all_gather_full_group", "test_all_gather_coalesced_simple", "test_all_gather_coalesced_with_empty",
    "test_barrier", "test_barrier_full_group", "test_barrier_timeout_global", "test_barrier_timeout_full_group",
    "test_monitored_barrier_gloo", *ALL_TO_ALL, "test_send_recv", "test_isend", "test_irecv", "test_batch_isend_irecv_gloo",
    "test_new_subgroups_with_group_param", "test_DistributedDataParallelCPU", "test_accumulate_gradients_no_sync",
)

# Gated on the backend's name alone (BACKEND == "gloo", != "mpi", or a set of names that leaves smddp out):
# on smddp they run with the gate bypassed, the test module reading the name as this one (runner.NamedAs).
NAME_GATED: dict[str, str] = {
    **dict.fromkeys(ALL_TO_ALL, "mpi"),
    **dict.fromkeys((
        "test_barrier_timeout_global", "test_barrier_timeout_full_group", "test_sparse_all_reduce_sum",
        *(name for name in COLLECTIVES if name.startswith("test_all_reduce_coalesced_") and "complex" not in name),
        "test_monitored_barrier_gloo", "test_monitored_barrier_gloo_subgroup", "test_monitored_barrier_gloo_rank_0_timeout",
        "test_all_gather_object_default_pg", "test_all_gather_object_subgroup", "test_gather_object", "test_gather_object_subgroup",
        "test_scatter_object_list", "test_grads_same_across_ranks_with_no_sync", "test_get_future",
        "test_accumulate_gradients_no_sync", "test_accumulate_gradients_no_sync_grad_is_view",
        "test_accumulate_gradients_no_sync_allreduce_hook", "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
        "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
    ), "gloo"),
}

# The skip list: tests of SUBSET not run on smddp, each with its reason. Edit here only.
SKIPPED_ON_SMDDP: dict[str, str] = {
    "test_ddp_logging_data_cpu": "checks torch's default gradient_as_bucket_view=False; over smddp DDP defaults to True "
                                 "(ddp.install_default_hook: gradients stay in the buckets; pass False to keep torch's)",
}

CONFIGS = {
    "ws4": Config(4, SUBSET),
    "ws2": Config(2, TRANSPORT),
    "ws4-tcp": Config(4, TRANSPORT, {"SMDDP_TRANSPORT": "tcp"}),  # no shared memory: every rank a node of its own
    "2x2-hosts": Config(4, TRANSPORT, ranks_per_host=2),  # shared memory within a simulated host, TCP between
}
