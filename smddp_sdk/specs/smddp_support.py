"""What AWS's SMDDP library accepts, so a rehearsal can say where the real job would fail. Data, stdlib only.

Each rule names its source. "documented" means AWS's SageMaker developer guide says it; "reported"
means a public report of SMDDP's own error; "our reading" means an inference from what AWS documents
works (for example, PyTorch FSDP works with SMDDP, so its reduce-scatter must). The rules are used by
the bundled backend's SageMaker check (``smddp_sdk.collectives.sagemaker_compat``) and by the
SageMaker scheduler's validation (instance types).
"""

from __future__ import annotations

from dataclasses import dataclass

PYTORCH_GUIDE = "https://docs.aws.amazon.com/sagemaker/latest/dg/data-parallel-modify-sdp-pt.html"
INTRO_GUIDE = "https://docs.aws.amazon.com/sagemaker/latest/dg/data-parallel-intro.html"
SUPPORT_GUIDE = "https://docs.aws.amazon.com/sagemaker/latest/dg/distributed-data-parallel-support.html"
AVG_REPORT = "https://github.com/aws/amazon-sagemaker-examples/issues/3967"


@dataclass(frozen=True)
class Rule:
    kind: str  # "collective", "reduce_op", "device", "subgroup"
    rule: str
    source: str
    basis: str  # "documented", "reported", "our reading"


# ProcessGroup methods (torch's dispatch names) that SMDDP runs. AllReduce and AllGather are SMDDP's
# own collectives (documented); DDP also needs broadcast and barrier, FSDP reduce-scatter, and AWS
# documents both working with SMDDP, so those are taken as supported (our reading).
SUPPORTED_COLLECTIVES = frozenset({
    "allreduce", "allreduce_coalesced", "allgather", "allgather_coalesced", "all_gather_single",
    "all_gather_single_coalesced", "broadcast", "barrier", "reduce_scatter_single", "reduce_scatter_single_coalesced",
    "reduce_scatter",
})

# The torch call a user wrote, for messages (ProcessGroup method -> torch.distributed function).
TORCH_NAMES = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce_coalesced", "allgather": "all_gather",
    "allgather_coalesced": "all_gather_coalesced", "all_gather_single": "all_gather_into_tensor",
    "all_gather_single_coalesced": "all_gather_into_tensor (coalesced)", "reduce_scatter_single": "reduce_scatter_tensor",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor (coalesced)", "alltoall": "all_to_all",
    "all_to_all_single": "all_to_all_single", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "broadcast": "broadcast", "barrier": "barrier", "reduce_scatter": "reduce_scatter", "send": "send", "recv": "recv",
}

# ReduceOp names SMDDP reduces with. DDP's gradient averaging uses SUM; ReduceOp.AVG is reported to
# fail with "SMDDP does not support: ReduceOp", and no other op is documented.
SUPPORTED_REDUCE_OPS = frozenset({"SUM"})

# Instance types AWS's SMDDP supports: SageMaker SDK v2's list (fw_utils.SM_DATAPARALLEL_SUPPORTED_INSTANCE_TYPES,
# no longer enforced by v2 since 2.221.1) plus ml.p5.48xlarge, which v2 accepts for smdistributed
# together with torch_distributed.
SUPPORTED_INSTANCE_TYPES = ("ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge")

RULES = (
    Rule("collective", "AllReduce and AllGather are SMDDP's collectives; broadcast, barrier and reduce-scatter run because DDP and FSDP need them; "
         "all_to_all, all_to_all_single, gather, scatter, reduce, send/recv are not offered", INTRO_GUIDE, "documented (AllReduce, AllGather); our reading (the rest)"),
    Rule("reduce_op", "only ReduceOp.SUM; ReduceOp.AVG fails with 'SMDDP does not support: ReduceOp'", AVG_REPORT, "reported (AVG); our reading (MIN, MAX, PRODUCT, ...)"),
    Rule("device", "CUDA tensors only: SMDDP ships as CUDA builds for GPU instance types", SUPPORT_GUIDE, "documented"),
    Rule("subgroup", "no torch.distributed.new_group() subgroups, and no other backend (NCCL, Gloo) alongside smddp", PYTORCH_GUIDE, "documented"),
    Rule("instance_type", f"{', '.join(SUPPORTED_INSTANCE_TYPES)}", SUPPORT_GUIDE, "documented (SageMaker SDK v2's list)"),
)


def collective_supported(method: str) -> bool:
    return method in SUPPORTED_COLLECTIVES


def reduce_op_supported(name: str) -> bool:
    return name.upper() in SUPPORTED_REDUCE_OPS


def instance_type_supported(instance_type: str) -> bool:
    return instance_type in SUPPORTED_INSTANCE_TYPES
