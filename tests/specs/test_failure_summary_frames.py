"""The failure summary keeps the user's innermost frame when a long traceback ends in library code."""

from __future__ import annotations

from smddp_sdk.specs.failure import FailureRecord, render_summary

LIBRARY = "/usr/lib/python3.11/site-packages/transformers/trainer.py"


def traceback_through_a_library(depth: int) -> str:
    lines = ["Traceback (most recent call last):", '  File "/opt/ml/code/train.py", line 42, in <module>', "    trainer.train()"]
    for level in range(depth):
        lines += [f'  File "{LIBRARY}", line {100 + level}, in step_{level}', f"    step_{level + 1}()"]
    return "\n".join([*lines, "RuntimeError: CUDA out of memory"])


def test_a_long_trace_keeps_the_users_innermost_frame_and_its_end() -> None:
    summary = render_summary(FailureRecord("algo-1", 0, 1, "RuntimeError: CUDA out of memory", traceback=traceback_through_a_library(30)))
    assert 'File "/opt/ml/code/train.py", line 42, in <module>' in summary and "trainer.train()" in summary
    assert "RuntimeError: CUDA out of memory" in summary.splitlines()[-2]
    assert "in step_29" in summary and "in step_3," not in summary  # the middle is left out, the end kept


def test_a_short_trace_is_shown_whole() -> None:
    summary = render_summary(FailureRecord("algo-1", 0, 1, "boom", traceback=traceback_through_a_library(3)))
    assert "lines above" not in summary and "in step_0" in summary
