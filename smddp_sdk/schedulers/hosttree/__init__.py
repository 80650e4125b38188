"""Everything jobs made of host trees share (local processes and docker containers).

- ``jobs``: the scheduler side (job directory, status, logs, cancel, list, remove), under ``local`` and ``docker``;
- ``job_dir``: the job directory, the one record of a job, and the ports of live jobs;
- ``supervisor``: the single detached supervisor that runs one job to its end;
- ``backend``: the small interface it starts hosts through, with ``process_backend`` (simulated hosts
  as process trees) and ``container_backend`` (one docker container per host);
- ``host_trees``, ``channels``, ``checkpoints``, ``stores``: the per-host /opt/ml trees, input channels,
  checkpoint sync and the S3 (or local) stores behind them;
- ``fidelity``: where a rehearsal differs from SageMaker, as dry-run notes and warnings;
- ``drill``: ``smddp-launch drill``, faults injected into a job of the user's and the report of what they cost.
"""
