"""Arena hijack against a live 2-host x 2-rank job: ``nobody`` fills /dev/shm with files and links named
like the job's segments before it starts, then watches the directory (inotify) and tries to open every
file the job creates there, for writing and for reading. The job's names derive from its secret, so the
decoys are never opened; its segments are 0600 from their creation, so the attacker is refused; the job
succeeds with correct results, and the decoys and the file a link points at are as they were
(docs/security.md#shared-memory)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from tests.hostile.live_mesh import SHM, left_in_shm, run_attacked_job, shm_entries
from tests.hostile.unprivileged import NOBODY, requires_nobody

pytest.importorskip("torch")
pytestmark = requires_nobody

DECOYS = 50

# argv[2]: a root-owned file for the decoy links to point at. Prints "decoys <json names>", "ready", then
# for each file created in /dev/shm by someone else: "<name> <how> <result>" per open attempt, result
# "opened" or the errno's name.
HIJACK = r'''
import ctypes, errno, json, os, secrets, select, struct
shm = "/dev/shm"
decoys = []
for i in range(50):
    name = "smddp-" + secrets.token_hex(20)
    if i % 2:
        os.symlink(sys.argv[2], os.path.join(shm, name))
    else:
        fd = os.open(os.path.join(shm, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        os.write(fd, b"decoy " + name.encode())
        os.fchmod(fd, 0o666)
        os.close(fd)
    decoys.append(name)
libc = ctypes.CDLL(None, use_errno=True)
watch = libc.inotify_init1(0)
IN_CREATE, IN_MOVED_TO = 0x100, 0x80
assert libc.inotify_add_watch(watch, shm.encode(), IN_CREATE | IN_MOVED_TO) >= 0
print("decoys", json.dumps(decoys), flush=True)
print("ready", flush=True)
while True:
    data = os.read(watch, 65536)
    at = 0
    while at < len(data):
        _, mask, _, size = struct.unpack_from("iIII", data, at)
        name = data[at + 16 : at + 16 + size].rstrip(b"\0").decode()
        at += 16 + size
        if name in decoys:
            continue
        path = os.path.join(shm, name)
        for how, flags in (("rdwr", os.O_RDWR), ("rdonly", os.O_RDONLY)):
            try:
                os.close(os.open(path, flags | os.O_NOFOLLOW))
                result = "opened"
            except OSError as exc:
                result = errno.errorcode.get(exc.errno, str(exc.errno))
            print(name, how, result, flush=True)
'''


def test_nobody_cannot_plant_or_open_the_job_s_shared_memory(tmp_path: Path) -> None:
    target = tmp_path / "root-secret"
    target.write_bytes(b"root only\n")
    target.chmod(0o600)
    tmp_path.chmod(0o755)  # nobody may name it in a link, not read it
    shm_before = shm_entries()
    try:
        outcome = run_attacked_job(tmp_path, HIJACK, str(target))
        lines = outcome.attacker.splitlines()
        decoys = json.loads(next(line for line in lines if line.startswith("decoys "))[len("decoys "):])
        attempts = [line.split() for line in lines if not line.startswith("decoys ")]

        assert outcome.succeeded_correctly(), outcome.output
        assert attempts, "the attacker saw no file of the job created in /dev/shm"
        refused = {result for _, _, result in attempts}
        assert refused <= {errno.errorcode[errno.EACCES], errno.errorcode[errno.ENOENT]}, attempts  # never "opened"
        assert errno.errorcode[errno.EACCES] in refused, attempts  # refused by owner and mode, not only too late
        for i, name in enumerate(decoys):  # the job neither used nor removed the attacker's files
            if i % 2:
                assert (SHM / name).is_symlink()
            else:
                assert (SHM / name).read_bytes() == b"decoy " + name.encode()
        assert target.read_bytes() == b"root only\n"
        assert left_in_shm(shm_before) == set(decoys)
    finally:
        for name in shm_entries() - shm_before:  # the attacker's decoys (the test's own leftovers)
            _remove_if_nobody_s(SHM / name)


def _remove_if_nobody_s(path: Path) -> None:
    try:
        if path.lstat().st_uid == NOBODY:
            path.unlink()
    except FileNotFoundError:
        pass
