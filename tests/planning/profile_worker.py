"""One rank of the profile test: DDP steps over smddp with SMDDP_PROFILE on, plus FSDP-style collectives."""

import sys

import torch
import torch.distributed as dist

import smddp_sdk.collectives  # noqa: F401 - registers smddp; SMDDP_PROFILE turns the recorder on


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("smddp")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    if sys.argv[1:] == ["smddp"]:  # smddp's own DDP: shared-memory buckets reduced with allreduce_shared
        from smddp_sdk.collectives.ddp import DistributedDataParallel

        model = DistributedDataParallel(net, bucket_cap_mb=0.25)
    else:
        model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.25)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(8, 256)).sum().backward()
        opt.step()
    n = dist.get_world_size()
    shard = torch.ones(1000)
    dist.all_gather_into_tensor(torch.empty(1000 * n), shard)  # gathered: 4000 * n bytes
    dist.reduce_scatter_tensor(shard, torch.ones(1000 * n))  # input: 4000 * n bytes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
