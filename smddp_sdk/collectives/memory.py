"""Byte-level helpers: copies through glibc memcpy (ctypes releases the GIL), reads from another process's
memory, socket views of tensors."""

from __future__ import annotations

import ctypes
import errno

import torch


def copy_bytes(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy src's bytes into dst (both contiguous, same byte size); memcpy beats torch copy_ here."""
    nbytes = src.numel() * src.element_size()
    if nbytes:
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
_libc.process_vm_readv.restype = ctypes.c_ssize_t


_PR_SET_PTRACER, _PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1).value


def allow_peer_reads() -> None:
    """Let this process's local peers read its memory under Yama's ptrace_scope=1 (the default on Ubuntu,
    where only ancestors may, and ranks are siblings), as Open MPI's shared-memory transport does; a no-op
    (EINVAL) on kernels without Yama. Reads stay limited to processes of the same user."""
    _libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(_PR_SET_PTRACER_ANY), 0, 0, 0)


def read_process(pid: int, dst: torch.Tensor, address: int) -> int:
    """Fill contiguous dst with the bytes at address in process pid (process_vm_readv: one copy, straight
    from the peer's memory); 0, or the errno when the kernel refuses (EPERM under ptrace rules or
    seccomp, ENOSYS) or the read fails."""
    done, nbytes = 0, dst.numel() * dst.element_size()
    while done < nbytes:
        local, remote = _IoVec(dst.data_ptr() + done, nbytes - done), _IoVec(address + done, nbytes - done)
        moved = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if moved <= 0:
            error = ctypes.get_errno() if moved < 0 else errno.EFAULT
            if error != errno.EINTR:
                return error
        else:
            done += moved
    return 0


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
