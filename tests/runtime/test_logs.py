"""The prefixing tee: whole lines, every line in the rank's file, and a vanished reader never blocks a rank."""

from __future__ import annotations

import io
import os

from smddp_sdk.runtime.logs import MAX_LINE, Console, LogPump, rank_prefix


class ClosedStream(io.BytesIO):
    def write(self, data: bytes) -> int:  # type: ignore[override]
        raise BrokenPipeError


def pump(tmp_path, payload: bytes, console: Console) -> LogPump:
    read_fd, write_fd = os.pipe()
    log = LogPump(os.fdopen(read_fd, "rb"), open(tmp_path / "rank-3.log", "ab"), rank_prefix("algo-2", 3), console)  # noqa: SIM115 - the pump closes it
    with os.fdopen(write_fd, "wb") as writer:  # the pump reads while we write: payloads may exceed the pipe
        writer.write(payload)
    log.join(5)
    return log


def test_lines_are_prefixed_on_the_console_and_whole_in_the_file(tmp_path):
    out = io.BytesIO()
    log = pump(tmp_path, b"epoch 1\nepoch 2\nno newline at the end", Console(out))
    assert out.getvalue() == b"[algo-2/rank3]: epoch 1\n[algo-2/rank3]: epoch 2\n[algo-2/rank3]: no newline at the end\n"
    assert (tmp_path / "rank-3.log").read_bytes() == b"epoch 1\nepoch 2\nno newline at the end"
    assert log.tail().endswith("no newline at the end")


def test_a_broken_console_does_not_stop_the_log_file(tmp_path):
    pump(tmp_path, b"a\nb\n", Console(ClosedStream()))
    assert (tmp_path / "rank-3.log").read_bytes() == b"a\nb\n"


def test_a_huge_line_is_passed_on_in_pieces(tmp_path):
    out = io.BytesIO()
    pump(tmp_path, b"x" * (MAX_LINE * 2 + 10) + b"\n", Console(out))
    assert out.getvalue().count(b"[algo-2/rank3]: ") == 3
    assert (tmp_path / "rank-3.log").stat().st_size == MAX_LINE * 2 + 11
