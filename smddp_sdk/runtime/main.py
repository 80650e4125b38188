"""The node runtime: contract -> rank plan -> one process per rank -> watch -> success or failure file.

Exit code: 0 on success; 2 for bad contract input; the root-cause rank's code (or 1) when the job
fails; 128 + N when the runtime itself is stopped by signal N (SIGTERM: 143, SIGINT: 130).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from smddp_sdk.errors import EXIT_JOB_FAILED, ContractError, SmddpError, UnavailableError
from smddp_sdk.runtime import env as rank_env
from smddp_sdk.runtime import optml_mount, stacks, usercode
from smddp_sdk.runtime import plan as planning
from smddp_sdk.runtime import store as rendezvous_store
from smddp_sdk.runtime.coordination import Coordinator, CoordinatorClient
from smddp_sdk.runtime.failures import rank_failure, root_cause
from smddp_sdk.runtime.logs import Console
from smddp_sdk.runtime.procs import RankProcess, Spare, die_with_parent, drop_spares, reap_groups, spawn_rank, start_spare, stop_ranks
from smddp_sdk.runtime.pythonpath import rank_python_path
from smddp_sdk.runtime.training_env import TrainingEnv, number_env, read_training_env
from smddp_sdk.specs import contract, events, limits
from smddp_sdk.specs.archives import append_inside
from smddp_sdk.specs.contract import OptMl
from smddp_sdk.specs.failure import SOURCE_EARLY_EXIT, SOURCE_RUNTIME, SOURCE_STOPPED, FailureRecord, failure_reason, must_stop, render_summary
from smddp_sdk.specs.processes import Wakeup, pid_alive
from smddp_sdk.specs.slurm_job import JOB_DIR_ENV as SLURM_JOB_DIR_ENV
from smddp_sdk.specs.slurm_job import SlurmJobDir

DEFAULT_STOP_GRACE = 5.0
DEFAULT_AGENT_TIMEOUT = 600.0  # hosts may start minutes apart (image pulls)
MAX_STOP_GRACE = 3600.0  # SMDDP_STOP_GRACE: a stop must end
MAX_AGENT_TIMEOUT = 86_400.0
POLL_INTERVAL = 0.1
STOP_SIGNAL_WAIT_S = 1.0  # how long a rank's death by SIGTERM waits for the runtime's own, before it reads as a failure
DEBUG_LEVEL = 10  # logging.DEBUG: container_log_level at or below it shows every host's set-up lines


def main(environ: Mapping[str, str] | None = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    # Under a host supervisor (local mode): stop, as on SIGTERM, when it dies.
    die_with_parent(signal.SIGTERM, environ.get(contract.PARENT_PID_ENV))
    console = Console()
    opt_ml = OptMl.from_env(environ)
    bound = None
    if optml_mount.wanted(environ):  # first: a user namespace cannot be entered once threads run
        try:
            bound = optml_mount.bind_host_tree(opt_ml.base)
        except optml_mount.OptMlUnavailable as exc:
            return _fail_before_start(opt_ml, console, exc)
    ahead = Ahead()
    if environ.get(contract.STANDBY_ENV):  # after the bind: the spares must see this host's /opt/ml
        ahead, given = _stand_by(environ)
        if given is None:
            return 0  # dropped before it was needed
        environ = given
    try:
        env = read_training_env(environ)
        if bound:
            env = dataclasses.replace(env, visible_base=optml_mount.OPT_ML)
        if bound and env.log_level <= DEBUG_LEVEL:
            console.say(contract.console_prefix(env.current_host, role="runtime"), f"this host's tree {opt_ml.base} is its /opt/ml (private mount namespace, {bound})")
        grace = number_env(environ, contract.STOP_GRACE_ENV, DEFAULT_STOP_GRACE, float, MAX_STOP_GRACE)
        agent_timeout = number_env(environ, contract.AGENT_TIMEOUT_ENV, DEFAULT_AGENT_TIMEOUT, float, MAX_AGENT_TIMEOUT)
    except ContractError as exc:
        return _fail_before_start(opt_ml, console, exc)
    try:
        runtime = NodeRuntime(env, environ, console, grace=grace, agent_timeout=agent_timeout, ahead=ahead)
        try:
            return runtime.run()
        finally:
            runtime.ahead.drop()  # what no rank or store took, also when the runtime failed before its ranks
    except Exception:  # noqa: BLE001 - a bug of ours: still leave a readable failure file behind
        trace = traceback.format_exc()
        console.say(contract.console_prefix(env.current_host), trace)
        contract.write_failure(opt_ml, f"Runtime error on host {env.current_host} (a bug in smddp_sdk):\n{trace}")
        return EXIT_JOB_FAILED


@dataclasses.dataclass
class Ahead:
    """What a standby started before it knew its attempt: spare ranks and a store helper, torch imported."""

    spares: list[Spare] = dataclasses.field(default_factory=list)
    store: rendezvous_store.HelperAhead | None = None

    def wait_ready(self) -> None:
        """Until each is warm; one that ended instead is left out (its rank starts cold)."""
        ready = {spare.popen.pid for spare in self.spares if spare.wait_ready()}
        drop_spares([spare for spare in self.spares if spare.popen.pid not in ready])
        self.spares = [spare for spare in self.spares if spare.popen.pid in ready]
        if self.store is not None and not self.store.wait_ready():
            self.store.drop()
            self.store = None

    def drop(self) -> None:
        drop_spares(self.spares)
        if self.store is not None:
            self.store.drop()
        self.spares, self.store = [], None


def _stand_by(environ: dict[str, str]) -> tuple[Ahead, dict[str, str] | None]:
    """A standby (warm restart): start the spares (and a store helper), then wait for the environment of
    the attempt this runtime will run (one JSON object on stdin, added to its own: a local host's whole
    environment, a container's token and restart count). End of file instead: not needed; None."""
    count = environ[contract.STANDBY_ENV]
    ahead = Ahead([start_spare(sys.executable, environ) for _ in range(int(count) if count.isdigit() else 0)])
    if rendezvous_store.store_address("-", environ):  # the master host's runtime serves the store (local mode)
        ahead.store = rendezvous_store.HelperAhead(sys.executable)
    ahead.wait_ready()
    print(contract.STANDBY_READY, flush=True)  # the first line the supervisor reads: this host can restart warm
    raw = sys.stdin.buffer.read()
    try:
        given = json.loads(raw) if raw else None
    except ValueError:
        given = None
    if not isinstance(given, dict):
        ahead.drop()
        return ahead, None
    # What it was started with (a container's planned environment), with the attempt's on top.
    kept = {key: value for key, value in environ.items() if key != contract.STANDBY_ENV}
    return ahead, {**kept, **{str(key): str(value) for key, value in given.items()}}


def _fail_before_start(opt_ml: OptMl, console: Console, exc: SmddpError) -> int:
    host = socket.gethostname()
    console.say(contract.console_prefix(host), f"error: {exc}")
    contract.write_failure(opt_ml, f"{type(exc).__name__}: {exc}\n")
    return exc.exit_code


class NodeRuntime:
    """Runs this host's share of the job and reports it, locally and to the other hosts."""

    def __init__(self, env: TrainingEnv, environ: Mapping[str, str], console: Console, *, grace: float, agent_timeout: float, ahead: Ahead | None = None) -> None:
        self.env = env
        self.ahead = ahead or Ahead()  # started ahead (a standby's): used for the ranks and the store when they fit
        self.environ = environ
        self.console = console
        self.grace = grace
        self.agent_timeout = agent_timeout
        self.prefix = contract.console_prefix(env.current_host)  # the one console-line format
        self.wake = Wakeup()  # set by signal handlers and threads: the watch loop looks at once
        self.remote_stop: FailureRecord | None = None
        self.signalled: signal.Signals | None = None
        self.coordinator: Coordinator | None = None
        self.client: CoordinatorClient | None = None
        self.procs: list[RankProcess] = []
        self.interpreter = usercode.Interpreter()
        self._signal_record: FailureRecord | None = None
        self.early_exits: list[FailureRecord] = []  # ranks that ended with 0 while others ran
        self.supervisor_gone = False
        self.supervised = bool(environ.get(contract.LIFELINE_ENV))
        self.survivors = self.supervised and environ.get(contract.SURVIVORS_ENV) == "1"  # a lost host is replaced alone
        # Whoever watches the job prints its failure summary once (the supervisor; on Slurm `run` and `status`).
        self.summary_elsewhere = self.supervised or bool(environ.get(SLURM_JOB_DIR_ENV))
        self.store: rendezvous_store.RendezvousStore | None = None
        self.store_env: dict[str, str] = {}
        self.code_entries: set[str] | None = None  # the code directory's own entries, before the ranks ran in it
        slurm_job = environ.get(SLURM_JOB_DIR_ENV)
        self.stack_requests = stacks.RequestFile(SlurmJobDir(Path(slurm_job)).stacks_request) if slurm_job else None

    def say(self, text: str) -> None:
        self.console.say(self.prefix, text)

    def detail(self, text: str) -> None:
        """A set-up line that carries nothing to act on: shown at container_log_level DEBUG only."""
        if self.env.log_level <= DEBUG_LEVEL:
            self.say(text)

    def say_once(self, text: str) -> None:
        """A line every host would print alike: the master host's says it for the job, the others at DEBUG."""
        (self.say if self.env.is_master else self.detail)(text)

    # --- the whole run ------------------------------------------------------------------------------

    def run(self) -> int:
        self._install_signal_handlers()
        self._watch_lifeline()
        try:
            self._join_job()  # first, so that even a planning error reaches the other hosts
            plan = self._plan()
        except SmddpError as exc:
            return self._finish_setup_failure(exc)
        scratch_root = self.environ.get(contract.SCRATCH_ENV) or None
        if scratch_root:
            Path(scratch_root).mkdir(parents=True, exist_ok=True)
        _sweep_stale_scratch()
        with tempfile.TemporaryDirectory(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-", dir=scratch_root) as scratch:
            try:
                command = self._prepare_code()
                self.code_entries = _entries(self.env.opt_ml.code_dir)
                python_path = rank_python_path(self.env.rank_opt_ml.code_dir, self.environ, scratch=Path(scratch))
                if self.signalled is None and self.remote_stop is None:
                    self._serve_store(Path(scratch), plan.world_size)
                    self._start_ranks(plan, command, python_path)
            except SmddpError as exc:
                return self._finish_setup_failure(exc)
            try:
                local_failures = self._watch()
            finally:
                reap_groups(self.procs)  # even if the runtime itself breaks, no rank outlives it
                if self.store is not None:
                    self.store.stop()
            code = self._finish(local_failures)
        if scratch_root:
            with contextlib.suppress(OSError):  # shared by the job's runtimes: the last one out (rmdir of an empty one) removes it
                Path(scratch_root).rmdir()
        return code

    def _serve_store(self, scratch: Path, world_size: int) -> None:
        """In local mode the master host serves the rendezvous store on its own address (runtime/store.py)."""
        env = self.env
        address = rendezvous_store.store_address(contract.bind_address(env.host_addresses, env.current_host), self.environ)
        if env.is_master:
            self.store = rendezvous_store.serve(address, env.ports.master, self.interpreter.python, self.say, scratch, world_size, ahead=self.ahead.store)
            self.ahead.store = None
            if self.store is not None:
                self.detail(f"rendezvous store serving on {address}:{env.ports.master}")
        elif self.ahead.store is not None:
            self.ahead.store.drop()
            self.ahead.store = None
        self.store_env = rendezvous_store.rank_environment(address, is_master=env.is_master, served=self.store is not None)

    def _plan(self) -> planning.RankPlan:
        env = self.env
        in_group = env.current_host in env.distribution_hosts
        shape = planning.launch_shape(env.framework_params, in_group)
        per_host = planning.processes_per_host(shape, env.framework_params, env.gpus_for_planning, env.num_neurons)
        plan = planning.plan_ranks(env.ordered_hosts, env.current_host, shape, per_host, planning.total_processes(shape, env.framework_params))
        self.say_once(
            f"job {env.job_name or '-'}: launch shape {plan.shape.value}, hosts {_listed(plan.hosts)}, "
            f"{plan.processes_per_host} processes per host, world size {plan.world_size}, "
            f"this host node rank {plan.node_rank}, ranks {[s.rank for s in plan.local_slots]}, "
            f"master {env.address_of(env.master_hostname)}:{env.ports.master}, SM_NUM_GPUS {env.num_gpus}"
            + (f" (this machine has no GPU; ranks planned for {env.planned_gpus})" if env.planned_gpus is not None else "")
        )
        return plan

    def _join_job(self) -> None:
        """Start the coordinator (first host) and connect to it; single-host jobs need neither."""
        env = self.env
        if len(env.hosts) == 1:
            return
        if env.is_master:
            try:
                self.coordinator = Coordinator(
                    env.hosts, env.job_token, env.ports.agent, log=self.say, address=contract.bind_address(env.host_addresses, env.current_host),
                    connect_timeout=self.agent_timeout, verdict_timeout=self.grace + 10.0, survivors=self.survivors,
                )
            except OSError as exc:
                raise UnavailableError(
                    f"cannot listen on the coordination port {env.ports.agent} ({exc.strerror}); "
                    f"set {contract.AGENT_PORT_ENV} to a free port for every host of the job"
                ) from None
            self.coordinator.start()
        self.client = CoordinatorClient(
            env.current_host, env.address_of(env.master_hostname), env.ports.agent, env.job_token,
            log=self.say, on_stop=self._on_remote_stop, connect_timeout=self.agent_timeout,
            on_lost=None if env.is_master else self._on_lost_coordinator,
        )
        self.client.start()

    def _prepare_code(self) -> usercode.UserCommand:
        env, code_dir = self.env, self.env.opt_ml.code_dir
        if usercode.fetch_code(env.submit_directory, code_dir):
            self.detail(f"code from {env.submit_directory} unpacked into {code_dir}")
        kind = usercode.entry_point_kind(env.user_entry_point, code_dir)
        usercode.check_entry_point(env.user_entry_point, code_dir, kind)
        cache = self.environ.get(contract.ENV_CACHE_ENV, "").strip()
        self.interpreter = usercode.install(
            code_dir, kind, lambda line: self.console.say(contract.console_prefix(env.current_host, role="setup"), line),
            cache=Path(cache) if cache else None, job_key=env.submit_directory or env.job_name or "",
        )
        args = rank_env.hyperparameter_argv(env.hyperparameters) + rank_env.script_argv(self.environ)
        # The ranks start where SageMaker starts them: in /opt/ml/code when this host's tree is bound there.
        # `smddp-launch -m pkg.train` names the module: its file runs as `python -m` runs it (as a package's would).
        run_as = usercode.EntryPointKind.PYTHON_PACKAGE if kind is usercode.EntryPointKind.PYTHON_PROGRAM and self.environ.get(contract.ENTRY_MODULE_ENV) else kind
        return usercode.user_command(env.user_entry_point, run_as, env.rank_opt_ml.code_dir, args, self.interpreter.python)

    def _start_ranks(self, plan: planning.RankPlan, command: usercode.UserCommand, python_path: list[str]) -> None:
        """Every rank's environment and log file are made and checked before the first rank starts: a job too
        big to exec, or a log the job replaced with a FIFO or a link, fails here with no rank running."""
        opt_ml = self.env.opt_ml
        launches = []
        for slot in plan.local_slots:
            error_file = opt_ml.rank_error_file(slot.rank)
            process_env = rank_env.process_env(self.environ, self.env, plan, slot, python_path=python_path, error_file=str(error_file))
            process_env.update(self.store_env)
            self.interpreter.apply(process_env)
            if problem := limits.exec_text_problem(command.argv, process_env):
                raise ContractError(f"rank {slot.rank} cannot be started: {problem}; remove it")
            if problem := limits.exec_size_problem(command.argv, process_env):
                raise ContractError(f"rank {slot.rank} cannot be started: {problem}; {_EXEC_HINT}")
            launches.append((slot, process_env, error_file, self._open_log(slot.rank)))
        for slot, process_env, error_file, log in launches:
            spare = self.ahead.spares.pop() if self.ahead.spares else None
            self.procs.append(spawn_rank(slot, command.argv, process_env, command.cwd, log, error_file, self.console, spare))
            if spare is not None and not self.procs[-1].warm:
                drop_spares([spare])
        self.ahead.drop()  # more spares than ranks: not kept while the job trains
        warm = bool(self.procs) and all(p.warm for p in self.procs)
        events.record(self.env.opt_ml.output_dir / events.FILE_NAME, events.RANKS_STARTED, attempt=events.attempt_of(self.environ), host=self.env.current_host, warm=warm, ranks=[p.slot.rank for p in self.procs])
        self.say_once(f"started ranks {[p.slot.rank for p in self.procs]}{' in spares started ahead' if warm else ''}: {shlex.join(command.argv)}")

    def _open_log(self, rank: int) -> BinaryIO:
        opt_ml = self.env.opt_ml
        relative = opt_ml.rank_log_file(rank).relative_to(opt_ml.base).as_posix()
        try:
            return append_inside(opt_ml.base, relative)
        except OSError as exc:
            raise ContractError(f"{opt_ml.base / relative}: cannot be the rank's log ({exc.strerror or exc}): a link or a special file is in its place; remove it") from None

    # --- watching -----------------------------------------------------------------------------------

    def _watch(self) -> list[FailureRecord]:
        failures: list[FailureRecord] = []
        first_seen: float | None = None
        stopping = False
        while any(p.running for p in self.procs):
            new = self._collect_exits()
            failures += new
            if new and not stopping:
                first_seen = first_seen or time.monotonic()
                self._report(new)
            settled = first_seen is not None and must_stop(failures, first_seen, time.monotonic())
            if not stopping and (settled or self.remote_stop or self.signalled):
                stopping = True
                self._stop(failures)
            if self.stack_requests and self.stack_requests.asked():  # `smddp-launch stacks` of a Slurm job
                stacks.ask_ranks(p.popen.pid for p in self.procs if p.running)
            self.wake.wait(POLL_INTERVAL)
        failures += self._collect_exits()
        if not stopping and self.signalled:
            self._stop(failures)
        return failures

    def _report(self, failures: list[FailureRecord]) -> None:
        """Tell the job of every rank failure at once; whether it stops now is the coordinator's call."""
        if self.client:
            for failure in failures:
                self.client.report_failure(failure)

    def _collect_exits(self) -> list[FailureRecord]:
        failures = []
        for proc in self.procs:
            if not proc.poll() or proc.stopped:
                continue
            if self._stopped_with_the_host(proc.returncode):
                proc.stopped = True  # scancel or a session-wide kill reached the rank first: a stop, not a failure
                continue
            slot, pid = proc.slot, proc.popen.pid
            if proc.returncode == 0:
                self.early_exits.append(FailureRecord(slot.host, slot.rank, 0, "", timestamp=proc.exited_at, source=SOURCE_EARLY_EXIT, local_rank=slot.local_rank, pid=pid))
            else:
                proc.pump.join(0.5)  # the last lines of a dead rank are still in the pipe for a moment
                failures.append(self._with_store_note(rank_failure(
                    host=slot.host, rank=slot.rank, local_rank=slot.local_rank, pid=pid, returncode=proc.returncode or 0, error_file=proc.error_file,
                    log_tail=proc.pump.tail(), observed_at=proc.exited_at)))
        return failures

    def _stopped_with_the_host(self, returncode: int | None) -> bool:
        """A rank that ended by SIGTERM or SIGINT (or its shell's 143 or 130) was stopped together with this
        runtime when the runtime's own signal follows within STOP_SIGNAL_WAIT_S (Slurm's scancel signals every
        process of the step at once, in no order)."""
        if returncode not in (-signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGINT):
            return False
        deadline = time.monotonic() + STOP_SIGNAL_WAIT_S
        while self.signalled is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.signalled is not None

    def _with_store_note(self, failure: FailureRecord) -> FailureRecord:
        """A rank that lost the rendezvous store (torch's Dist* errors) names what happened to the store, if anything
        did (connections it closed, its helper's end), instead of a bare DistNetworkError."""
        note = self.store.note_for_failure() if self.store and failure.error_type.startswith("Dist") else ""
        return dataclasses.replace(failure, message=f"{failure.message} ({note})") if note else failure

    def _stop(self, failures: list[FailureRecord]) -> None:
        """Stop every rank here (failures went to the job as they came; a signal is told now)."""
        if failures:
            first = root_cause(failures)
            assert first is not None
            self.say(f"{first.headline}; stopping the other ranks")
        elif self.signalled:
            self.say(f"received {self.signalled.name}; forwarding it to every rank")
            if self.client:
                self.client.report_failure(self._signal_failure())
        elif self.remote_stop and self.remote_stop.error_type == "Signal":  # a cancel elsewhere: no failure to name
            self.say(f"stopping: host {self.remote_stop.host} was stopped ({self.remote_stop.message})")
        elif self.remote_stop:
            self.say(f"stopping: {self.remote_stop.headline}")
        sig = self.signalled or signal.SIGTERM
        stop_ranks(self.procs, self.grace, sig)

    # --- outcome ------------------------------------------------------------------------------------

    def _finish(self, local_failures: list[FailureRecord]) -> int:
        self._report_code_writes()
        if self.signalled and not local_failures:
            local_failures = [self._signal_failure()]
        status = "failed" if local_failures else ("stopped" if self.remote_stop else "ok")
        # Without a supervisor there is nobody left to settle with: stop at once (the 10 s budget).
        verdict = None if self.supervisor_gone else self._settle(status, local_failures)
        if status == "ok":
            try:
                contract.write_success(self.env.opt_ml)
            except OSError as exc:  # output (or output/success) is a link the job made: not followed
                self.say(f"output/success not written: {exc.strerror} (a link in {self.env.opt_ml.output_dir}?)")
            self.detail("all ranks on this host finished successfully")
            return 0
        cause, others = verdict or (root_cause([*local_failures, *self.early_exits]) or self.remote_stop, local_failures)
        assert cause is not None
        self._write_records([*local_failures, cause, *others])
        contract.write_failure(self.env.opt_ml, failure_reason(cause, others))
        if self.signalled and cause.rank is None:  # stopped from outside (cancel, StopTrainingJob): no failure to report
            self.say(f"stopped by {self.signalled.name}")
        elif self.summary_elsewhere:
            self.say(f"this host failed; root cause: {cause.headline}")
        else:
            self.console.say(self.prefix, render_summary(cause, others))
        if self.signalled and cause.rank is None and cause.host == self.env.current_host:
            return 128 + int(self.signalled)
        # The root-cause rank's code as the runtime's own (SageMaker's contract); 1 for signals and odd codes.
        return cause.exit_code if 0 < cause.exit_code < 126 else EXIT_JOB_FAILED

    def _report_code_writes(self) -> None:
        """What the ranks wrote in their working directory, this host's own copy of the code, is lost with the job
        (as on SageMaker; a torchrun user expects a shared directory): said once, naming it."""
        if self.code_entries is None:
            return
        written = sorted(_entries(self.env.opt_ml.code_dir) - self.code_entries - {"__pycache__/"})
        if written:
            shown = ", ".join(written[:5]) + (f" and {len(written) - 5} more" if len(written) > 5 else "")
            self.say(f"the ranks wrote {shown} in {self.env.rank_opt_ml.code_dir}, this host's own copy of the code: not archived, "
                     "not seen by the other hosts, gone with the job (as on SageMaker); write checkpoints to /opt/ml/checkpoints "
                     "(checkpoint_local_path: the next run finds them) and the model to SM_MODEL_DIR")

    def _write_records(self, records: list[FailureRecord]) -> None:
        """output/failures.json: every record this host knows, for the supervisor's root-cause rule."""
        unique: dict[tuple[object, ...], FailureRecord] = {}
        for record in [*records, *self.early_exits, *([self.remote_stop] if self.remote_stop else [])]:
            unique.setdefault((record.host, record.rank, record.error_type, record.message, record.source), record)
        try:
            contract.write_failure_records(self.env.opt_ml, [record.to_json() for record in unique.values()])
        except OSError as exc:
            self.say(f"could not write {self.env.opt_ml.failures_file}: {exc}")

    def _settle(self, status: str, failures: list[FailureRecord]) -> tuple[FailureRecord, list[FailureRecord]] | None:
        """Report this host's result; when the job failed, learn the job-wide root cause."""
        if self.client is None:
            return None
        self.client.report_final(status, [*failures, *self.early_exits])  # exits with 0 are the verdict's evidence
        verdict = None
        replaced = self.survivors and not self.env.is_master  # the others train on: no verdict comes for this host
        if status != "ok" and not replaced:
            verdict = self.client.wait_verdict(self.grace + 15.0)
        if self.coordinator is not None:
            self._serve_until_everyone_reported()
            verdict = verdict or self.client.verdict
        else:
            # A quick host may finish before the coordinator listens: its result must still arrive, or
            # the coordinator would count it as a host that never joined.
            self.client.flush(self.agent_timeout)
        self.client.close()
        if self.coordinator is not None:
            self.coordinator.close()
        return verdict

    def _serve_until_everyone_reported(self) -> None:
        assert self.coordinator is not None
        if not self.coordinator.done.is_set():
            self.say("waiting for the other hosts to finish (this host coordinates the job)")
        while not self.coordinator.done.wait(0.5):
            if self.signalled:  # stopped while waiting: give the others a last chance to hear the verdict
                self.coordinator.done.wait(self.grace + 10.0)
                return

    def _finish_setup_failure(self, exc: SmddpError) -> int:
        code = exc.exit_code
        failure = FailureRecord(host=self.env.current_host, rank=None, exit_code=code, error_type=type(exc).__name__, message=str(exc), timestamp=time.time(), source=SOURCE_RUNTIME)
        self._write_records([failure])
        self.say(f"error: {exc}")
        if self.client:
            self.client.report_failure(failure)
            self.client.report_final("failed", [failure])
            self.client.wait_verdict(2.0)  # let the message leave before the process does
            self.client.close()
        if self.coordinator:
            self.coordinator.done.wait(self.grace + 10.0)
            self.coordinator.close()
        contract.write_failure(self.env.opt_ml, failure_reason(failure))
        return code

    # --- signals and remote stops -------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGCHLD, lambda *_: self.wake.set())  # a rank ended: look now, not at the next poll
        stacks.forward_stack_requests(lambda: [p.popen.pid for p in self.procs if p.running])

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.signalled is None:
            self.signalled = signal.Signals(signum)
        self.wake.set()

    def _watch_lifeline(self) -> None:
        """Under a host supervisor: read its FIFO until end-of-file, which means it died."""
        path = self.environ.get(contract.LIFELINE_ENV)
        if not path:
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # never blocks, writer or not
        except OSError as exc:
            self.say(f"cannot open the supervisor's lifeline {path} ({exc.strerror}); stopping")
            self._on_supervisor_gone()
            return
        os.set_blocking(fd, True)  # a blocking read returns b"" once no writer is left
        threading.Thread(target=self._read_lifeline, args=(fd,), name="lifeline", daemon=True).start()

    def _read_lifeline(self, fd: int) -> None:
        with contextlib.suppress(OSError):  # os.read retries on EINTR itself (PEP 475)
            while os.read(fd, 64):
                pass
        os.close(fd)
        self._on_supervisor_gone()

    def _on_supervisor_gone(self) -> None:
        self.supervisor_gone = True
        if self.remote_stop is None:
            self.remote_stop = FailureRecord(
                self.env.current_host, None, 1, "the job's supervisor is gone; this host stopped its ranks", timestamp=time.time(), error_type="SupervisorGone", source=SOURCE_STOPPED
            )
        self.wake.set()

    def _on_lost_coordinator(self) -> None:
        """The coordinating host's runtime vanished: stop now rather than train headless, and say whose."""
        master = self.env.master_hostname
        self._on_remote_stop(FailureRecord(
            master, None, 1, f"the runtime on {master}, which coordinates the job, disconnected (seen from {self.env.current_host})",
            timestamp=time.time(), error_type="LostPeer", source=SOURCE_RUNTIME,
        ))

    def _on_remote_stop(self, failure: FailureRecord) -> None:
        if self.remote_stop is None:
            self.remote_stop = failure
        self.wake.set()

    def _signal_failure(self) -> FailureRecord:
        assert self.signalled is not None
        if self._signal_record is None:
            self._signal_record = FailureRecord(
                host=self.env.current_host, rank=None, exit_code=128 + int(self.signalled), error_type="Signal",
                message=f"the runtime received {self.signalled.name} and stopped its ranks", timestamp=time.time(),
            )
        return self._signal_record


# What makes a rank's argv and environment big: every hyperparameter is in both (SM_HPS, SM_HP_*,
# SM_TRAINING_ENV, SM_USER_ARGS and the argv), the host list and the channels are in several SM_* variables.
_EXEC_HINT = "fewer or smaller hyperparameters (pass data as a file or channel), fewer hosts or channels, or a smaller inherited environment"

def _listed(names: tuple[str, ...], shown: int = 8) -> str:
    """A host list as one line shows it: all of a few, the first ones and the count of many."""
    if len(names) <= shown:
        return str(list(names))
    return f"[{', '.join(map(repr, names[:shown]))}, ... ({len(names)} in all)]"


_SCRATCH_PREFIX = "smddp-runtime-"


def _entries(directory: Path) -> set[str]:
    """A directory's own entries, folders with a slash; empty where it cannot be read."""
    try:
        return {entry.name + ("/" if entry.is_dir(follow_symlinks=False) else "") for entry in os.scandir(directory)}
    except OSError:
        return set()


def _sweep_stale_scratch() -> None:
    """Remove scratch directories of runtimes that were killed before they could (SIGKILL, OOM)."""
    root = Path(tempfile.gettempdir())
    try:
        entries = list(root.glob(f"{_SCRATCH_PREFIX}*-*"))
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(_SCRATCH_PREFIX):].split("-", 1)[0]
        try:
            if not pid.isdigit() or entry.stat().st_uid != os.getuid() or pid_alive(int(pid)):
                continue
        except OSError:
            continue
        shutil.rmtree(entry, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
