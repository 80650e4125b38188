"""Byte-level helpers: copies through glibc memcpy (ctypes releases the GIL), socket views of tensors."""

from __future__ import annotations

import ctypes

import torch


def copy_bytes(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy src's bytes into dst (both contiguous, same byte size); memcpy beats torch copy_ here."""
    nbytes = src.numel() * src.element_size()
    if nbytes:
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (bf16 and bool included)."""
    flat = tensor.reshape(-1)
    if flat.numel() and flat.stride(0) != 1:  # contiguous with size-1 dims may keep an odd stride
        flat = flat.as_strided((flat.numel(),), (1,))
    if flat.dtype == torch.uint8:
        return flat
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


def memview(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview over a contiguous CPU tensor's bytes, for socket send/recv_into."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return memoryview(bytearray(0))
    return memoryview((ctypes.c_ubyte * nbytes).from_address(tensor.data_ptr())).cast("B")
