"""Training logs from CloudWatch: every host's stream, all pages, merged by time, prefixed by host.

SageMaker writes one stream per host, ``<job>/algo-<n>-<epoch>``, in the log group
``/aws/sagemaker/TrainingJobs``. Streams appear as hosts start, so they are looked up again on every
poll, through every page of ``DescribeLogStreams`` (50 streams a page; v2 reads only the first).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence
from typing import Any

from smddp_sdk.schedulers.sagemaker.client import call, is_not_found, translate
from smddp_sdk.specs import contract
from smddp_sdk.specs.status import LogLine

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
LAST_LINES_DELAY = 5.0  # seconds to let CloudWatch catch up before the final read of a finished job
_HOST_STREAM = re.compile(r"^(?P<host>algo-\d+)(?:-\d+)?$")


def host_of_stream(stream: str, job_name: str) -> str:
    """``<job>/algo-2-1700000000`` -> ``algo-2`` (other stream names are kept whole)."""
    rest = stream[len(job_name) + 1 :] if stream.startswith(job_name + "/") else stream
    match = _HOST_STREAM.match(rest)
    return match.group("host") if match else rest


def console_url(region: str, job_name: str) -> str:
    """The CloudWatch console page with this job's streams."""
    group = LOG_GROUP.replace("/", "$252F")
    return f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#logsV2:log-groups/log-group/{group}$3FlogStreamNameFilter$3D{job_name}$252F"


def to_log_line(host: str, event: dict[str, Any]) -> LogLine:
    """A CloudWatch event as a LogLine, through the one console-line parser: ``[algo-1/rank3]:`` becomes
    ``rank``, the runtime's own ``[algo-1]:`` (or older ``[algo-1/runtime]:``) is dropped as a prefix."""
    raw = str(event.get("message", "")).rstrip("\n")
    parsed = contract.parse_console_line(raw, host)
    if parsed.host != host:  # a line that only looks prefixed (another host's name in it): keep it whole
        parsed = LogLine(host, raw)
    return LogLine(host=host, text=parsed.text, rank=parsed.rank, stream="stdout", timestamp=event.get("timestamp", 0) / 1000.0)


class LogTail:
    """Reads what is new in every stream of one job since the previous ``poll``."""

    def __init__(self, client: Any, job_name: str, *, hosts: Sequence[str] | None = None, ranks: Sequence[int] | None = None) -> None:
        self.client = client
        self.job_name = job_name
        self.hosts = set(hosts) if hosts else None
        self.ranks = set(ranks) if ranks else None
        self.tokens: dict[str, str | None] = {}  # stream -> nextForwardToken

    def discover(self) -> None:
        """Find streams that appeared since the last look, reading every page."""
        paginator = self.client.get_paginator("describe_log_streams")
        pages = paginator.paginate(logGroupName=LOG_GROUP, logStreamNamePrefix=self.job_name + "/")
        try:
            for page in pages:
                for stream in page.get("logStreams", []):
                    self.tokens.setdefault(stream["logStreamName"], None)
        except Exception as exc:  # noqa: BLE001
            if not is_not_found(exc):  # no log group yet: the job has not written anything
                raise translate(exc, f"list the log streams of {self.job_name}") from None

    def poll(self) -> list[LogLine]:
        """New lines of every stream, merged by timestamp."""
        per_stream = [self._read_stream(stream) for stream in sorted(self.tokens) if self.hosts is None or host_of_stream(stream, self.job_name) in self.hosts]
        merged = heapq.merge(*per_stream, key=lambda line: line.timestamp or 0.0)
        return [line for line in merged if self.ranks is None or line.rank in self.ranks]

    def _read_stream(self, stream: str) -> list[LogLine]:
        host = host_of_stream(stream, self.job_name)
        lines: list[LogLine] = []
        while True:
            params: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamName": stream, "startFromHead": True}
            token = self.tokens[stream]
            if token:
                params["nextToken"] = token
            page = call(f"read the log stream {stream}", self.client.get_log_events, **params)
            self.tokens[stream] = page.get("nextForwardToken") or token
            events = page.get("events", [])
            lines += [to_log_line(host, event) for event in events]
            if not events or self.tokens[stream] == token:
                return lines


def read_all(tail: LogTail) -> list[LogLine]:
    tail.discover()
    return tail.poll()
