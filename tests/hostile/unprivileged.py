"""Attacks run as a real unprivileged local user (``nobody``), the threat of docs/security.md.

``as_nobody(code)`` runs Python source as uid/gid 65534 through ``setpriv`` with the system interpreter
(the one ``nobody`` can read; torch is not needed there). The source gets ``ATTACKER_TOOLS`` in front of it:
a stdlib client of torch's TCPStore wire protocol, so an attacker can read, wait for and overwrite the
rendezvous store's keys as any local user who can reach its port can.

Tests that need it are skipped with the reason where this is not root or ``setpriv`` is missing; CI runs
as root, so they run there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"

# Runs in the attacker's process (stdlib only). torch's TCPStore protocol (TCPStoreBackend.hpp): a client
# first sends VALIDATE (query type 0) with the magic number; strings and values go as a native-endian
# uint64 length and the bytes; torch's client puts "/" before every key, so this one does too.
ATTACKER_TOOLS = r'''
import socket, struct, sys, time

class Store:
    VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT = range(7)
    MAGIC = 0x3C85F7CE

    def __init__(self, host, port, timeout=30.0):
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.sendall(struct.pack("=BI", self.VALIDATE, self.MAGIC))

    def _key(self, key):
        return self._string("/" + key)

    def _string(self, data):
        data = data.encode() if isinstance(data, str) else bytes(data)
        return struct.pack("=Q", len(data)) + data

    def _recv(self, count):
        data = b""
        while len(data) < count:
            part = self.sock.recv(count - len(data))
            if not part:
                raise ConnectionError("the store closed the connection")
            data += part
        return data

    def set(self, key, value):
        self.sock.sendall(bytes([self.SET]) + self._key(key) + self._string(value))

    def check(self, keys):
        self.sock.sendall(bytes([self.CHECK]) + struct.pack("=Q", len(keys)) + b"".join(self._key(k) for k in keys))
        return self._recv(1)[0] == 0  # READY

    def get(self, key):
        """The value once the key exists (WAIT, then GET, as torch's client does)."""
        self.sock.sendall(bytes([self.WAIT]) + struct.pack("=Q", 1) + self._key(key))
        self._recv(1)
        self.sock.sendall(bytes([self.GET]) + self._key(key))
        return self._recv(struct.unpack("=Q", self._recv(8))[0])

    def wait_for(self, key, timeout=60.0, poll=0.005):
        """Poll until key exists (without blocking the connection in WAIT); False on timeout."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.check([key]):
                return True
            time.sleep(poll)
        return False
'''


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "attacks as another local user need root (setpriv to nobody); CI runs as root"
    if not shutil.which("setpriv"):
        return "setpriv (util-linux) is missing"
    if not Path(SYSTEM_PYTHON).exists():
        return f"{SYSTEM_PYTHON} is missing (the attacker's interpreter)"
    return None


requires_nobody = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")


def nobody_command(code: str) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", SYSTEM_PYTHON, "-c", ATTACKER_TOOLS + code]


def as_nobody(code: str, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (with ATTACKER_TOOLS; ``sys.argv[1:]`` is ``args``) as nobody and wait for it."""
    return subprocess.run([*nobody_command(code), *args], cwd="/", capture_output=True, text=True, timeout=timeout, env={"PATH": "/usr/bin:/bin"})


def start_as_nobody(code: str, *args: str) -> subprocess.Popen[str]:
    """Start ``code`` as nobody in the background (an attacker racing a live job)."""
    return subprocess.Popen([*nobody_command(code), *args], cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"})
