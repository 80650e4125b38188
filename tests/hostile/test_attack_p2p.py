"""Point-to-point's local listeners against another local user (docs/collectives.md#point-to-point): the
abstract Unix socket's name shows in /proc/net/unix, so ``nobody`` can find and connect to it; the
connection is closed before anything is read from it or answered, and the ranks' messages still flow."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from tests.collectives.test_p2p import ONE_HOST, run_ranks  # noqa: E402
from tests.hostile.unprivileged import as_nobody, requires_nobody  # noqa: E402

pytestmark = pytest.mark.jobs

ATTACK = r'''
import json, socket
names = [line.split()[-1] for line in open("/proc/net/unix").read().splitlines()[1:] if "@smddp-p2p-" in line]
report = {"names": len(set(names)), "connected": 0, "answered": 0}
for name in set(names):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(3)
    try:
        sock.connect("\0" + name[1:])
    except OSError:
        continue
    report["connected"] += 1
    try:
        sock.sendall(b"\x00" * 12)  # a claimed rank 0 and an address: what a rank would send
        report["answered"] += len(sock.recv(16))
    except OSError:
        pass
    sock.close()
print(json.dumps(report))
'''


@requires_nobody
def test_another_user_connecting_to_a_local_listener_is_refused_unanswered():
    attacks: list[dict] = []

    def attack(store: dist.TCPStore) -> None:
        store.wait(["p2p-up"])
        result = as_nobody(ATTACK)
        attacks.append(json.loads(result.stdout) if result.returncode == 0 else {"error": result.stderr})
        store.set("flooded", "1")

    reports = run_ranks(ONE_HOST, "local_attack", timeout=120, meanwhile=attack)
    assert all(report.get("ok") for report in reports), (reports, attacks)
    assert attacks[0].get("connected", 0) >= 1, attacks  # the attacker found a listener and reached it
    assert attacks[0]["answered"] == 0, attacks  # ... and got nothing back: closed unread
