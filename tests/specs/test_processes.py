"""specs/processes.py: what /proc says about the machine's processes."""

import os

from smddp_sdk.specs.processes import runnable_tasks


def test_runnable_tasks_reads_the_running_count_of_proc_loadavg():
    assert runnable_tasks("0.52 3.10 6.40 3/412 12345\n") == 3
    assert runnable_tasks("7.00 7.00 7.00 17/900 1\n") == 17


def test_runnable_tasks_counts_the_caller_and_falls_back_to_the_load_average():
    if os.path.exists("/proc/loadavg"):
        assert runnable_tasks() >= 1  # this process is running while it reads
    before = os.getloadavg()[0]
    fallback = runnable_tasks("garbled")
    assert fallback in (before, os.getloadavg()[0])  # the 1-minute average, read around the call
