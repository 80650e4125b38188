"""The ml.* instance types people train on: vCPUs, GPUs and memory, so the rank plan can be rehearsed.

Data, not code: when SageMaker adds a type, add a row here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceType:
    name: str
    vcpus: int
    gpus: int
    memory_gib: int
    gpu_model: str = ""
    neuron_devices: int = 0

    @property
    def is_local(self) -> bool:
        return self.name in ("local", "local_gpu")


def _family(prefix: str, gpu_model: str, rows: list[tuple[str, int, int, int]]) -> dict[str, InstanceType]:
    return {f"ml.{prefix}.{size}": InstanceType(f"ml.{prefix}.{size}", cpu, gpu, mem, gpu_model) for size, cpu, gpu, mem in rows}


CATALOG: dict[str, InstanceType] = {
    # Local mode: "local" is CPU only; "local_gpu" uses the GPUs this machine has (counted at run time).
    "local": InstanceType("local", 0, 0, 0),
    "local_gpu": InstanceType("local_gpu", 0, 0, 0),
    **_family("p3", "V100", [("2xlarge", 8, 1, 61), ("8xlarge", 32, 4, 244), ("16xlarge", 64, 8, 488)]),
    **_family("p3dn", "V100", [("24xlarge", 96, 8, 768)]),
    **_family("p4d", "A100", [("24xlarge", 96, 8, 1152)]),
    **_family("p4de", "A100", [("24xlarge", 96, 8, 1152)]),
    **_family("p5", "H100", [("48xlarge", 192, 8, 2048)]),
    **_family("p5e", "H200", [("48xlarge", 192, 8, 2048)]),
    **_family("p5en", "H200", [("48xlarge", 192, 8, 2048)]),
    **_family("g4dn", "T4", [("xlarge", 4, 1, 16), ("2xlarge", 8, 1, 32), ("4xlarge", 16, 1, 64), ("8xlarge", 32, 1, 128), ("12xlarge", 48, 4, 192), ("16xlarge", 64, 1, 256)]),
    **_family(
        "g5",
        "A10G",
        [("xlarge", 4, 1, 16), ("2xlarge", 8, 1, 32), ("4xlarge", 16, 1, 64), ("8xlarge", 32, 1, 128),
         ("12xlarge", 48, 4, 192), ("16xlarge", 64, 1, 256), ("24xlarge", 96, 4, 384), ("48xlarge", 192, 8, 768)],
    ),
    **_family(
        "g6",
        "L4",
        [("xlarge", 4, 1, 16), ("2xlarge", 8, 1, 32), ("4xlarge", 16, 1, 64), ("8xlarge", 32, 1, 128),
         ("12xlarge", 48, 4, 192), ("16xlarge", 64, 1, 256), ("24xlarge", 96, 4, 384), ("48xlarge", 192, 8, 768)],
    ),
    **_family(
        "g6e",
        "L40S",
        [("xlarge", 4, 1, 32), ("2xlarge", 8, 1, 64), ("4xlarge", 16, 1, 128), ("8xlarge", 32, 1, 256),
         ("12xlarge", 48, 4, 384), ("16xlarge", 64, 1, 512), ("24xlarge", 96, 4, 768), ("48xlarge", 192, 8, 1536)],
    ),
    "ml.trn1.2xlarge": InstanceType("ml.trn1.2xlarge", 8, 0, 32, "Trainium", neuron_devices=1),
    "ml.trn1.32xlarge": InstanceType("ml.trn1.32xlarge", 128, 0, 512, "Trainium", neuron_devices=16),
    **_family("c5", "", [("xlarge", 4, 0, 8), ("2xlarge", 8, 0, 16), ("4xlarge", 16, 0, 32), ("9xlarge", 36, 0, 72), ("18xlarge", 72, 0, 144)]),
    **_family("c6i", "", [("xlarge", 4, 0, 8), ("2xlarge", 8, 0, 16), ("4xlarge", 16, 0, 32), ("8xlarge", 32, 0, 64), ("16xlarge", 64, 0, 128), ("32xlarge", 128, 0, 256)]),
    **_family("m5", "", [("large", 2, 0, 8), ("xlarge", 4, 0, 16), ("2xlarge", 8, 0, 32), ("4xlarge", 16, 0, 64), ("12xlarge", 48, 0, 192), ("24xlarge", 96, 0, 384)]),
    **_family("m6i", "", [("large", 2, 0, 8), ("xlarge", 4, 0, 16), ("2xlarge", 8, 0, 32), ("4xlarge", 16, 0, 64), ("8xlarge", 32, 0, 128), ("16xlarge", 64, 0, 256), ("32xlarge", 128, 0, 512)]),
}

def lookup(name: str) -> InstanceType | None:
    return CATALOG.get(name)


def markdown_table() -> str:
    """The catalogue as the Markdown table in docs/instance-types.md (a test keeps the two equal)."""
    rows = ["| instance type | vCPUs | GPUs | GPU | memory (GiB) | ranks per host |", "|---|---|---|---|---|---|"]
    for entry in CATALOG.values():
        if entry.is_local:
            continue
        ranks = entry.gpus or 1
        rows.append(f"| `{entry.name}` | {entry.vcpus} | {entry.gpus} | {entry.gpu_model or '-'} | {entry.memory_gib} | {ranks} |")
    return "\n".join(rows) + "\n"
