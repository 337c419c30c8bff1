"""GPU memory by product name (pure data): what vLLM's `gpu_memory_utilization` is a share of.

Bytes as the driver reports them (`nvidia-smi --query-gpu=name,memory.total`, in MiB; `rocm-smi
--showmeminfo vram`, in bytes), each taken from published output of that command on the product (`source` quotes it).
A product is looked up by the name nvidia-smi prints or as the node label
`nvidia.com/gpu.product` writes it (dashes for spaces), case-insensitively.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

_MIB: Final = 2**20
_SMI: Final = "nvidia-smi memory.total"


@dataclass(frozen=True)
class GpuProduct:
    """One GPU product: its memory in bytes and where the number comes from."""

    memory_bytes: int
    source: str


GPU_PRODUCTS: Final[dict[str, GpuProduct]] = {
    "NVIDIA H100 80GB HBM3": GpuProduct(81559 * _MIB, f"{_SMI}: 81559 MiB"),
    "NVIDIA H100 NVL": GpuProduct(95830 * _MIB, f"{_SMI}: 95830 MiB"),
    "NVIDIA H200": GpuProduct(143771 * _MIB, f"{_SMI}: 143771 MiB"),
    "NVIDIA B200": GpuProduct(183359 * _MIB, f"{_SMI}: 183359 MiB"),
    "NVIDIA A100-SXM4-80GB": GpuProduct(81920 * _MIB, f"{_SMI}: 81920 MiB"),
    "NVIDIA A100-SXM4-40GB": GpuProduct(40960 * _MIB, f"{_SMI}: 40960 MiB"),
    "NVIDIA L40S": GpuProduct(46068 * _MIB, f"{_SMI}: 46068 MiB"),
    "AMD Instinct MI300X": GpuProduct(205_822_885_888, "rocm-smi VRAM Total Memory (B): 205822885888"),
}
# What nvidia-smi reports for an H100 80GB HBM3 (the GPU of the published cost profile).
H100_80GB_BYTES: Final = GPU_PRODUCTS["NVIDIA H100 80GB HBM3"].memory_bytes


def _key(product: str) -> str:
    # The node label writes nvidia-smi's spaces as dashes, and some names have dashes of their own
    # (A100-SXM4-80GB): compare both with every dash and space as one separator.
    return " ".join(product.replace("-", " ").split()).lower()


_BY_KEY: Final[dict[str, GpuProduct]] = {_key(name): gpu for name, gpu in GPU_PRODUCTS.items()}


def gpu_memory_bytes(product: str | None) -> float | None:
    """The memory of a GPU product (nvidia-smi's name or the node label's dashed one); None: unknown."""
    gpu = _BY_KEY.get(_key(product)) if product else None
    return float(gpu.memory_bytes) if gpu is not None else None
