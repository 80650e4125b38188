#!/usr/bin/env python3
"""A stand-in for the docker CLI, enough for the container backend's lifecycle: no engine needed.

State lives in $FAKE_DOCKER_STATE (one JSON file per container or network). A "container" runs as the
``start -a`` process itself; what it does comes from its FAKE_RUN environment variable:
``exit:<code>:<seconds>`` (print a line, wait, exit), ``sleep`` (until signalled; SIGTERM exits 143),
``die:<seconds>`` (as if the engine killed it: exit 137), ``die-once:<seconds>`` (``die`` at the
container name's first start, ``exit:0:0.1`` after). ``run -i`` is ``create`` and ``start -a``; a container
with ``SMDDP_STANDBY_SPARES`` is a standby (warm restart): it prints ``smddp: standby ready`` (after
FAKE_STANDBY_READY seconds; ``fail`` there exits 1 at once instead) and waits on its stdin for a JSON object
added to its environment (end of file: it exits 0), as the runtime's standby does. Every command line it was given is appended to
``argv.log`` there, one JSON list a line, as anyone could read it in /proc/*/cmdline; every container
created, with its environment, to ``created.log`` (kept after ``rm``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

STATE = Path(os.environ["FAKE_DOCKER_STATE"])


def main(argv: list[str]) -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "argv.log", "a") as log:
        log.write(json.dumps(argv) + "\n")
    command, args = argv[0], argv[1:]
    if command == "version" or command == "info":
        print("28.0.0-fake")
    elif command == "image":
        print("fakeimageid")
    elif command == "network":
        return network(args)
    elif command == "create":
        return create(args)
    elif command == "start":
        return start(args)
    elif command == "run":
        create([word for word in args if word != "-i"])
        return start([args[args.index("--name") + 1]])
    elif command == "inspect":
        print(json.dumps(state_of(args[-1])))
    elif command == "kill":
        signal_container(args[-1], int(args[args.index("-s") + 1]))
    elif command == "stop":
        for name in args[2:]:
            signal_container(name, signal.SIGTERM)
    elif command == "ps":
        every = "-aq" in args or "-a" in args
        label = args[args.index("--filter") + 1].removeprefix("label=")
        for item in records("container"):
            if label_matches(item, label) and (every or item["State"]["Running"]):
                print(item["Name"])
    elif command == "rm":
        for name in args[1:]:
            signal_container(name, signal.SIGKILL)
            (STATE / f"container-{name}.json").unlink(missing_ok=True)
    elif command == "logs":
        pass
    else:
        print(f"fake docker: unsupported command {command}", file=sys.stderr)
        return 1
    return 0


def network(args: list[str]) -> int:
    if args[0] == "create":
        labels = [args[i + 1] for i, word in enumerate(args) if word == "--label"]
        save("network", args[-1], {"Name": args[-1], "Labels": labels})
    elif args[0] == "ls":
        label = args[args.index("--filter") + 1].removeprefix("label=")
        for item in records("network"):
            if label_matches(item, label):
                print(item["Name"])
    elif args[0] == "rm":
        for name in args[1:]:
            (STATE / f"network-{name}.json").unlink(missing_ok=True)
    return 0


def create(args: list[str]) -> int:
    name = args[args.index("--name") + 1]
    labels = [args[i + 1] for i, word in enumerate(args) if word == "--label"]
    env = environment([args[i + 1] for i, word in enumerate(args) if word == "-e"])
    mounts = dict(reversed(args[i + 1].split(":")[:2]) for i, word in enumerate(args) if word == "-v")  # target: source
    save("container", name, {"Name": name, "Hostname": args[args.index("--hostname") + 1], "Labels": labels, "Env": env, "Mounts": mounts,
                             "State": {"Running": False, "Status": "created", "ExitCode": 0, "OOMKilled": False, "FinishedAt": "", "Pid": 0}})
    with open(STATE / "created.log", "a") as log:
        log.write(json.dumps({"Name": name, "Env": env}) + "\n")
    return 0


def environment(entries: list[str]) -> dict[str, str]:
    """As docker reads ``-e``: ``NAME=value``, or ``NAME`` alone for the value of NAME in the client's own
    environment (left out when the client has none)."""
    env = {}
    for entry in entries:
        name, has_value, value = entry.partition("=")
        if has_value or name in os.environ:
            env[name] = value if has_value else os.environ[name]
    return env


def start(args: list[str]) -> int:
    name = args[-1]
    record = load("container", name)
    record["State"].update(Running=True, Status="running", Pid=os.getpid())
    save("container", name, record)
    host = record["Hostname"]
    env = record["Env"]
    if "SMDDP_STANDBY_SPARES" in env:
        woken = stand_by(env)
        if woken is None:
            return finish(name, 0 if env.get("FAKE_STANDBY_READY") != "fail" else 1)
        env = {**env, **woken}
        record["Env"] = env
        save("container", name, record)
    behaviour = env.get(f"FAKE_RUN_{host.replace('-', '_').upper()}") or env.get("FAKE_RUN", "exit:0:0.1")
    if behaviour.startswith("die-once:"):
        first = STATE / f"started-{env.get('TRAINING_JOB_NAME', '')}-{host}"  # a host's first start, whatever its container's name
        behaviour = "exit:0:0.1" if first.exists() else behaviour.replace("die-once:", "die:", 1)
        first.touch()
    if env.get("FAKE_SNAPSHOT"):  # a rank's recovery snapshot, in the host's scratch folder (mounted at SMDDP_SCRATCH_DIR)
        keep_snapshot(record["Mounts"].get(env.get("SMDDP_SCRATCH_DIR", "")), host)
    return finish(name, run(behaviour, env.get("TRAINING_JOB_NAME", ""), host))


def keep_snapshot(scratch: str | None, host: str) -> None:
    if scratch:
        folder = Path(scratch) / "snapshots" / host
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "rank-0.snapshot").write_bytes(b"fake")


def finish(name: str, code: int) -> int:
    try:
        record = load("container", name)
    except FileNotFoundError:  # removed while it ran (rm -f)
        return code
    record["State"].update(Running=False, Status="exited", ExitCode=code, FinishedAt="2026-01-01T00:00:00.5Z")
    save("container", name, record)
    return code


def stand_by(env: dict) -> dict | None:
    """The runtime's standby: ready, then the attempt's variables from stdin; None at end of file (or ``fail``)."""
    ready = env.get("FAKE_STANDBY_READY", "0")
    if ready == "fail":
        print("fake standby: could not start its spares", flush=True)
        return None
    time.sleep(float(ready))
    print("smddp: standby ready", flush=True)
    raw = sys.stdin.read()
    return json.loads(raw) if raw else None


def run(behaviour: str, job: str, host: str) -> int:
    stopped: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(143))
    kind, *rest = behaviour.split(":")
    print(f"[{host}/rank0]: fake container of {job} running", flush=True)
    print("a line without a prefix", flush=True)
    if kind == "exit":
        time.sleep(float(rest[1]))
        return int(rest[0])
    if kind == "die":
        time.sleep(float(rest[0]))
        return 137
    while not stopped:
        time.sleep(0.05)
    return stopped[0]


def signal_container(name: str, sig: int) -> None:
    try:
        pid = load("container", name)["State"]["Pid"]
    except FileNotFoundError:
        return
    if pid:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def state_of(name: str) -> dict:
    return load("container", name)["State"]


def label_matches(item: dict, label: str) -> bool:
    return label in item["Labels"]


def records(kind: str) -> list[dict]:
    found = []
    for path in STATE.glob(f"{kind}-*.json"):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return found


def load(kind: str, name: str) -> dict:
    return json.loads((STATE / f"{kind}-{name}.json").read_text())


def save(kind: str, name: str, record: dict) -> None:
    partial = STATE / f".{kind}-{name}.{os.getpid()}"
    partial.write_text(json.dumps(record))
    os.replace(partial, STATE / f"{kind}-{name}.json")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
