"""A small CNN trained data-parallel over the ``smddp`` backend, on synthetic images.

The script is written the way AWS's SMDDP examples are, so it runs unchanged on SageMaker's PyTorch
containers and, through smddp-sdk, on a laptop: 2 simulated hosts x 2 ranks finish in about a minute on
two CPU cores. Hyperparameters arrive as command-line flags (``--epochs 3``); the model is saved by rank 0
into ``SM_MODEL_DIR`` and the final metrics into ``SM_OUTPUT_DATA_DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  registers the "smddp" backend
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

CLASSES = 10
IMAGE_SIZE = 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by the world size")
    parser.add_argument("--samples", type=int, default=4096, help="training images in all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "model"))
    parser.add_argument("--output-data-dir", default=os.environ.get("SM_OUTPUT_DATA_DIR", "output"))
    return parser.parse_args()


def synthetic_images(samples: int, seed: int) -> TensorDataset:
    """Noisy copies of one fixed random template per class: learnable, and identical on every rank.
    The templates are the same for every ``seed``, so a test set drawn with another seed is comparable."""
    templates = torch.randn(CLASSES, 1, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(1234))
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (samples,), generator=generator)
    images = templates[labels] + 1.5 * torch.randn(samples, 1, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
    return TensorDataset(images, labels)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.head = nn.Linear(32 * (IMAGE_SIZE // 4) ** 2, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(torch.flatten(x, 1))


def global_mean(value: float, count: int) -> float:
    """The mean over every rank's samples (one all_reduce of [sum, count])."""
    totals = torch.tensor([value * count, float(count)])
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def train_epoch(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer) -> float:
    model.train()
    loss_sum, seen = 0.0, 0
    for images, labels in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()  # DDP averages the gradients across all ranks over smddp here
        optimizer.step()
        loss_sum += loss.item() * len(labels)
        seen += len(labels)
    return global_mean(loss_sum / max(seen, 1), seen)


def accuracy(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct, seen = 0, 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images).argmax(dim=1) == labels).sum().item()
            seen += len(labels)
    return global_mean(correct / max(seen, 1), seen)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)  # several ranks share this machine's cores
    dist.init_process_group("smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP also broadcasts rank 0's)

    train_set = synthetic_images(args.samples, args.seed)
    test_set = synthetic_images(args.samples // 4, args.seed + 1)
    train_sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=256, sampler=DistributedSampler(test_set, num_replicas=world, rank=rank, shuffle=False))

    model = DistributedDataParallel(SmallCNN())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world, momentum=0.9)  # linear LR scaling
    if rank == 0:
        print(f"training on {world} ranks, {args.samples} images, {args.epochs} epochs", flush=True)

    started = time.time()
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        loss = train_epoch(model, train_loader, optimizer)
        acc = accuracy(model, test_loader)
        if rank == 0:
            print(f"epoch {epoch}: loss {loss:.4f}, test accuracy {acc:.3f}", flush=True)

    if rank == 0:
        os.makedirs(args.model_dir, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(args.model_dir, "model.pt"))
        os.makedirs(args.output_data_dir, exist_ok=True)
        metrics = {"world_size": world, "epochs": args.epochs, "loss": loss, "test_accuracy": acc, "seconds": time.time() - started}
        with open(os.path.join(args.output_data_dir, "metrics.json"), "w", encoding="utf-8") as handle:
            json.dump(metrics, handle, indent=2)
        print(f"saved the model to {args.model_dir}/model.pt", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
