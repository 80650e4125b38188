"""One lifecycle for jobs made of host trees (local processes and docker containers).

- ``jobs``: the scheduler side every host-tree scheduler shares (job directory, status, logs, cancel);
- ``supervisor``: the single detached supervisor that runs one job to its end;
- ``backend``: the small interface it starts hosts through, with ``process_backend`` (simulated hosts
  as process trees) and ``container_backend`` (one docker container per host).
"""
