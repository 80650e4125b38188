"""Who is at the other end of a TCP connection: the owner (uid) of the peer's socket, where this machine knows it.

Linux lists every TCP socket of a network namespace, with its owner's uid, in /proc/net/tcp and /proc/net/tcp6.
The peer of a connection from this machine (loopback, or any local address) is the socket whose local and remote
ends are the connection's remote and local ones. A peer on another machine or in another network namespace is
not listed: its uid is unknown (None), and a listener bounds such peers by their address instead.

Listeners use it to keep slots that another local user cannot take: connections from the job's own uid are
never refused or evicted for a bound, strangers get a small bound of their own. The store's helper process runs
this module's source in front of its own (runtime/store.py), so keep it standard library and self-contained.
"""

from __future__ import annotations

import ipaddress
import socket
import sys

SOCKET_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
Endpoint = tuple[str, int]


def _endpoint(field: str) -> Endpoint:
    """An address:port field of /proc/net/tcp*: hex, each 32-bit word of the address in host byte order."""
    address, _, port = field.partition(":")
    raw = bytes.fromhex(address)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return _normal(str(ipaddress.ip_address(raw))), int(port, 16)


def _normal(address: str) -> str:
    """One spelling per address: IPv4-mapped IPv6 addresses as IPv4, no zone."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return str(ip)


def socket_owners() -> dict[tuple[Endpoint, Endpoint], int]:
    """(local end, remote end) -> owner uid of every TCP socket in this network namespace ({} off Linux)."""
    owners = {}
    for table in SOCKET_TABLES:
        try:
            with open(table) as rows:
                next(rows, None)  # the header line
                for row in rows:
                    fields = row.split()
                    if len(fields) > 7:
                        owners[(_endpoint(fields[1]), _endpoint(fields[2]))] = int(fields[7])
        except (OSError, ValueError):
            continue
    return owners


def peer_uid(sock: socket.socket, owners: dict[tuple[Endpoint, Endpoint], int] | None = None) -> int | None:
    """The uid owning the other end of the connected sock, or None where this machine does not list it."""
    try:
        here, there = sock.getsockname(), sock.getpeername()
    except OSError:
        return None
    owners = socket_owners() if owners is None else owners
    return owners.get(((_normal(there[0]), there[1]), (_normal(here[0]), here[1])))


def peer_address(sock: socket.socket) -> str:
    """The peer's address in one spelling ("" once it has gone)."""
    try:
        return _normal(sock.getpeername()[0])
    except (OSError, ValueError):
        return ""
