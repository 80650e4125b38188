#!/usr/bin/env bash
# The test command (README and CI): set everything up on a fresh machine, then run the whole suite,
# heavy tests included. For the quick default run during development: python3 -m pytest (it leaves out
# the tests marked docker, slurm, netns, faults and jobs; tests/conftest.py's JOBS lists the jobs ones).
# Each step prints its start as "==> [elapsed] step"; the last lines give every step's duration.
#
# Docker part (first): where no engine answers and this runs as root (CI), it starts a private engine
# (scripts/docker-engine.sh, installing docker.io when missing), builds the image, runs the tests marked
# `docker`, and stops the engine it started. Elsewhere the docker tests use a running engine or skip
# with the reason. SMDDP_SKIP_DOCKER=1 leaves the docker part out.
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
STEP="" STEP_AT=$SECONDS TIMES=()
# step NAME: end the step before (its time goes into the closing table) and announce the next.
step() {
  [[ -z $STEP ]] || TIMES+=("$(printf '%6ds  %s' $((SECONDS - STEP_AT)) "$STEP")")
  STEP=$1 STEP_AT=$SECONDS
  [[ -z $STEP ]] || printf '==> [%4ds] %s\n' $((SECONDS - START)) "$STEP"
}
step "setup"
bash scripts/setup.sh
# The SageMaker SDK v2 and v3 oracles for the parity tests live in their own virtualenvs; where it cannot be
# installed the parity tests skip and say so.
step "SageMaker SDK v2 oracle"
bash scripts/setup-sagemaker-oracle.sh || echo "warning: the SageMaker SDK v2 oracle could not be installed; the parity tests will skip"
step "SageMaker SDK v3 oracle"
bash scripts/setup-sagemaker-v3-oracle.sh || echo "warning: the SageMaker SDK v3 oracle could not be installed; the v3 parity tests will skip"

rc=0
# Lint first: it takes a second and its findings are worth reading before a long run. The format check
# reports files the formatter would change; it fails the run only with SMDDP_STRICT_FORMAT=1.
step "ruff"
python3 -m ruff check . || rc=1
if ! python3 -m ruff format --check --quiet . >/dev/null 2>&1; then
  echo "note: some files are not formatted (python3 -m ruff format --check . lists them; ruff format . fixes them)"
  [[ ${SMDDP_STRICT_FORMAT:-0} == 1 ]] && rc=1
fi

if [[ ${SMDDP_SKIP_DOCKER:-0} != 1 ]]; then
  step "docker engine and image"
  started=0
  if bash scripts/docker-engine.sh status >/dev/null 2>&1; then
    eval "$(bash scripts/docker-engine.sh start)"  # one that runs already: use it, leave it running
  elif [[ $(id -u) == 0 ]]; then
    if engine_env=$(bash scripts/docker-engine.sh start); then
      eval "$engine_env"; started=1
      trap 'bash scripts/docker-engine.sh stop' EXIT
    else
      echo "==> could not start a Docker engine; the docker tests will skip" >&2
    fi
  fi
  if docker info >/dev/null 2>&1; then
    # Built here, once, with progress; the tests find the image and reuse it.
    if image=$(bash scripts/build-image.sh); then
      export SMDDP_TEST_IMAGE_BUILT=$image  # the docker tests use it instead of building again
    else
      rc=1
    fi
  fi
  step "docker tests"
  drc=0
  python3 -m pytest -m docker "$@" || drc=$?
  # pytest exits 5 when it collects no test, which is not a failure here.
  [[ $drc == 0 || $drc == 5 ]] || rc=$drc
  if [[ $started == 1 ]]; then bash scripts/docker-engine.sh stop; trap - EXIT; unset DOCKER_HOST; fi
fi
# Slurm part: a controller and three node daemons on this machine (scripts/slurm-cluster.sh, installing
# Debian's slurmctld, slurmd, slurm-client and munge when missing; needs root), the tests marked `slurm`
# run real jobs through it, and the cluster this started is stopped. Elsewhere they use a running cluster
# or skip with the reason. SMDDP_SKIP_SLURM=1 leaves the Slurm part out.
if [[ ${SMDDP_SKIP_SLURM:-0} != 1 ]]; then
  step "slurm cluster"
  slurm_started=0
  if bash scripts/slurm-cluster.sh status >/dev/null 2>&1; then
    eval "$(bash scripts/slurm-cluster.sh env)"  # one that runs already: use it, leave it running
  elif [[ $(id -u) == 0 ]]; then
    if cluster_env=$(CI=true bash scripts/slurm-cluster.sh start); then
      eval "$cluster_env"; slurm_started=1
      trap 'bash scripts/slurm-cluster.sh stop' EXIT
    else
      echo "==> could not start a local Slurm cluster; the slurm tests will skip" >&2
    fi
  fi
  step "slurm tests"
  src=0
  python3 -m pytest -m slurm "$@" || src=$?
  [[ $src == 0 || $src == 5 ]] || rc=$src  # 5: no test collected, not a failure
  if [[ $slurm_started == 1 ]]; then bash scripts/slurm-cluster.sh stop; trap - EXIT; unset SLURM_CONF; fi
fi
# Fault injection into running local jobs (kills, hangs, a frozen supervisor): culprit named, nothing left.
step "fault-injection tests"
frc=0
python3 -m pytest -m faults "$@" || frc=$?
[[ $frc == 0 || $frc == 5 ]] || rc=$frc  # 5: no test collected (torch missing), not a failure
# Real jobs and many processes (the `jobs` marker): what the default run leaves out.
step "job tests"
jrc=0
python3 -m pytest -m "jobs and not docker and not faults and not hostile and not slurm" "$@" || jrc=$?
[[ $jrc == 0 || $jrc == 5 ]] || rc=$jrc  # 5: "$@" selected none of them, not a failure
# The rest of the suite (the default run, with the netns tests where root can make namespaces).
step "the other tests"
python3 -m pytest -m "not jobs and not docker and not faults and not hostile and not slurm" "$@" || rc=$?
# The hostile-input suite (bad job files and arguments, hostile tarballs and connections) on its own, so
# its summary stands apart. pytest exits 5 when "$@" selects none of it, which is not a failure.
step "hostile-input tests"
hrc=0
python3 -m pytest -m hostile -q "$@" || hrc=$?
[[ $hrc == 0 || $hrc == 5 ]] || rc=$hrc
step ""
echo "==> step times (seconds)"
printf '%s\n' "${TIMES[@]}"
printf '%6ds  total\n' $((SECONDS - START))
exit "$rc"
