"""Point-to-point rings against another local user (docs/security.md, shared memory): ``nobody`` who
learned a ring's name (here the test hands it over; it is derived from the job's secret) plants a file
or a link there before the sender makes the ring. The sender refuses to open or write it and sends over
the socket; the planted file is left as it was. A receiver never maps a file that is not this user's
0600 file of the ring's size."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from smddp_sdk.collectives.errors import CollectiveError  # noqa: E402
from smddp_sdk.collectives.ring import MIN_RING_BYTES, RING_HEADER, Ring  # noqa: E402
from tests.collectives.test_p2p_ring import run_ranks  # noqa: E402
from tests.hostile.unprivileged import NOBODY, as_nobody, requires_nobody  # noqa: E402

pytestmark = pytest.mark.jobs

PLANT = r'''
import os, sys
path, kind = sys.argv[1], sys.argv[2]
if kind == "link":
    os.symlink("/tmp/smddp-ring-bait", path)
else:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    os.write(fd, b"planted by nobody" * 64)
    os.close(fd)
print("planted")
'''


@requires_nobody
@pytest.mark.parametrize("kind", ["file", "link"])
def test_a_file_planted_at_a_rings_name_is_never_used_and_the_message_still_arrives(kind):
    planted: list[str] = []

    def plant(store: dist.TCPStore) -> None:
        store.wait(["ring-path"])
        path = store.get("ring-path").decode()
        result = as_nobody(PLANT, path, kind)
        planted.append(path if result.returncode == 0 else f"failed: {result.stderr}")
        store.set("planted", "1")

    try:
        reports = run_ranks(2, "planted", {}, timeout=120, meanwhile=plant)
        assert planted and not planted[0].startswith("failed"), planted
        assert all(report.get("ok") for report in reports), reports
        assert not reports[0]["rings"], reports  # the sender fell back to the socket
        info = os.lstat(planted[0])
        assert info.st_uid == NOBODY, info  # still nobody's, never replaced or removed
        if kind == "file":
            with open(planted[0], "rb") as planted_file:
                assert planted_file.read() == b"planted by nobody" * 64  # never written
        else:
            assert stat.S_ISLNK(info.st_mode) and not os.path.exists("/tmp/smddp-ring-bait")  # never followed
    finally:
        if planted and not planted[0].startswith("failed") and os.path.lexists(planted[0]):
            os.unlink(planted[0])


@requires_nobody
def test_a_receiver_refuses_a_ring_file_of_another_user():
    """What the receiver opens (Ring.open, shm.open_segment's checks) when the name holds another user's
    file of exactly the ring's size and mode: refused before it is mapped."""
    directory = tempfile.mkdtemp(dir="/dev/shm", prefix="smddp-test-")
    try:
        os.chmod(directory, 0o1777)
        path = os.path.join(directory, "ring")
        made = as_nobody("import os, sys\nfd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)\n"
                         "os.ftruncate(fd, int(sys.argv[2]))\n", path, str(RING_HEADER + MIN_RING_BYTES))
        assert made.returncode == 0, made.stderr
        with pytest.raises(CollectiveError, match=f"owned by uid {NOBODY}"):
            Ring.open(path, MIN_RING_BYTES)
    finally:
        shutil.rmtree(directory)
