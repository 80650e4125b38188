"""The node runtime: ``python -m smddp_sdk.runtime`` (the image's ``train`` command).

It reads this host's /opt/ml contract, plans the ranks, starts one process per rank, watches them and
writes ``output/success`` or ``output/failure``. Standard library only: it must run in any user image.
Nothing imports it; schedulers run it as a process. See docs/runtime.md.
"""
