"""Whether a lost host is replaced alone while the others train on (``survive_host_loss``, docs/resuming.md).

The rule, in order: a host lost while another one's replacement has not trained yet is a survivor that
failed (its script could not re-form the group: not looping with ``Recoverable.steps``, torch's DDP); the first host serves the rendezvous
store and the coordinator, so losing it loses the group the others would re-form; a host lost while
another has failed leaves no whole set of survivors; each replacement takes one of ``max_retry_attempts``,
so none is left means none. Every refusal is a reason the supervisor says before it restarts every host.
"""

from __future__ import annotations

from collections.abc import Sequence


def why_not_replace(host: str, hosts: Sequence[str], *, failed: Sequence[str], retries_left: int, rejoining: Sequence[str] = ()) -> str:
    """"" when ``host`` (just lost) can be replaced alone; else why every host restarts instead.
    ``rejoining``: the hosts replaced alone whose new ranks have not trained yet."""
    if others := [name for name in rejoining if name != host]:
        return f"{host} failed while {', '.join(others)} rejoined (its ranks did not re-form the group: see their error)"
    if host == hosts[0]:
        return f"{host} served the rendezvous store and the coordinator"
    if others := [name for name in failed if name != host]:
        return f"{', '.join(others)} failed too"
    if retries_left <= 0:
        return "no retry is left (max_retry_attempts)"
    return ""
