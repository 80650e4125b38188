"""A corpus of hostile and malformed job files: each a YAML text (or a function making one) and every
line the CLI must print for it, exactly (``job.yaml:LINE:COL: message``), in order."""

from __future__ import annotations

from collections.abc import Callable

HEAD = "entry_point: train.py\ninstance_type: local\n"


def laughs(levels: int, width: int = 10, where: str = "hyperparameters:\n  h: *a{last}\n") -> str:
    text = HEAD + "a0: &a0 [" + ", ".join(["lol"] * width) + "]\n"
    for i in range(1, levels):
        text += f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]\n"
    return text + where.format(last=levels - 1)


def deep_flow(depth: int) -> str:
    return HEAD + "hyperparameters:\n  x: " + "[" * depth + "]" * depth + "\n"


def deep_block(depth: int) -> str:
    return HEAD + "hyperparameters:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(depth)) + "  " * (depth + 1) + "v: 1\n"


def big_hyperparameters() -> str:
    return HEAD + "hyperparameters:\n" + "".join(f"  k{i}: {'x' * 1000}\n" for i in range(140))


def big_environment() -> str:
    return HEAD + "environment:\n" + "".join(f"  K{i}: {'x' * 1000}\n" for i in range(140))


def nested_json(depth: int) -> str:
    return HEAD + "hyperparameters:\n  x: " + "[" * depth + "1" + "]" * depth + "\n"


LONG_NAME = "a" * 64
NAME_RULE = "must be 1-63 letters, digits and hyphens, starting and ending with a letter or digit, got"
HP_TYPES = "(use strings, numbers, booleans, null, lists and mappings of them)"
ENV_RULE = "(use letters, digits and '_', not starting with a digit; no '=', spaces or NUL)"
NUL_HINT = "contains a NUL character, which cannot be passed to a process (remove it)"
RESERVED = "is set by smddp-sdk and cannot be overridden"
PPH = "scheduler_options.processes_per_host: must be"

Case = tuple[str, "str | Callable[[], str]", list[str]]

CASES: list[Case] = [
    # --- YAML structure: bounded, and errors instead of tracebacks ---------------------------------
    ("billion laughs", lambda: laughs(9), ["job.yaml:7:5: YAML syntax error: aliases expand to more than 100000 values; write the values out or use fewer aliases"]),
    ("billion laughs wide", lambda: laughs(4, width=400), ["job.yaml:4:5: YAML syntax error: aliases expand to more than 100000 values; write the values out or use fewer aliases"]),
    (
        "laughs in distribution",
        lambda: laughs(9, where="distribution: *a{last}\n"),
        ["job.yaml:7:5: YAML syntax error: aliases expand to more than 100000 values; write the values out or use fewer aliases"],
    ),
    ("recursive alias mapping", HEAD + "hyperparameters: &a\n  x: *a\n", ["job.yaml:3:18: YAML syntax error: recursive alias: an anchor is used inside its own value"]),
    ("recursive alias list", HEAD + "dependencies: &a [*a]\n", ["job.yaml:3:15: YAML syntax error: recursive alias: an anchor is used inside its own value"]),
    ("recursive alias deep", HEAD + "tags: &t\n  - a:\n      b: [*t]\n", ["job.yaml:3:7: YAML syntax error: recursive alias: an anchor is used inside its own value"]),
    ("deep flow nesting", lambda: deep_flow(100_000), ["job.yaml:4:68: YAML syntax error: nesting is deeper than 64 levels; flatten the structure"]),
    ("deep flow nesting 65", lambda: deep_flow(65), ["job.yaml:4:68: YAML syntax error: nesting is deeper than 64 levels; flatten the structure"]),
    ("deep block nesting", lambda: deep_block(200), ["job.yaml:67:129: YAML syntax error: nesting is deeper than 64 levels; flatten the structure"]),
    (
        "deep through aliases",
        lambda: HEAD + "".join(f"a{i}: &a{i} [{'*a' + str(i - 1) if i else 1}]\n" for i in range(70)) + "hyperparameters: {x: *a69}\n",
        ["job.yaml:66:6: YAML syntax error: aliases expand to nesting deeper than 64 levels; write the values out or use fewer aliases"],
    ),
    ("file over 1 MiB", lambda: HEAD + "# " + "x" * (1024 * 1024) + "\n", ["job.yaml:1:1: YAML syntax error: the file is larger than 1048576 bytes, the limit for job files"]),
    ("integer top-level key", HEAD + "1: x\n", ["job.yaml:3:1: keys must be strings '1' (field names are text such as entry_point)"]),
    ("null top-level key", HEAD + "~: x\n", ["job.yaml:3:1: keys must be strings '~' (field names are text such as entry_point)"]),
    ("bool top-level key", HEAD + "true: x\n", ["job.yaml:3:1: keys must be strings 'true' (field names are text such as entry_point)"]),
    ("float top-level key", HEAD + "1.5: x\n", ["job.yaml:1:1: line 3: the key 1.5 is not a field name (field names are text such as entry_point)"]),
    ("list as key", HEAD + "? [a, b]\n: x\n", ["job.yaml:3:3: YAML syntax error: found unhashable key (while constructing a mapping)"]),
    ("top-level list", "- entry_point: train.py\n", ["job.yaml:1:1: must be a mapping of job fields (key: value lines), not a list"]),
    ("top-level scalar", "train.py\n", ["job.yaml:1:1: must be a mapping of job fields (key: value lines), not a str"]),
    ("top-level number", "12\n", ["job.yaml:1:1: must be a mapping of job fields (key: value lines), not a int"]),
    ("empty file", "", ["job.yaml:1:1: the file is empty (a job needs at least entry_point: and instance_type: (run `smddp-launch init` for a commented example))"]),
    ("only comments", "# nothing\n", ["job.yaml:1:1: the file is empty (a job needs at least entry_point: and instance_type: (run `smddp-launch init` for a commented example))"]),
    ("NUL byte in file", HEAD + "role: a\0b\n", ["job.yaml:3:8: YAML syntax error: the character U+0000 is not allowed in YAML; remove it or write it as an escape in a quoted string"]),
    (
        "python object tag",
        HEAD + "hyperparameters: !!python/object/apply:os.system [echo hi]\n",
        ["job.yaml:3:18: YAML syntax error: could not determine a constructor for the tag 'tag:yaml.org,2002:python/object/apply:os.system'"],
    ),
    (
        "merge of a scalar",
        HEAD + "hyperparameters:\n  <<: 3\n",
        ["job.yaml:4:7: YAML syntax error: expected a mapping or list of mappings for merging, but found scalar (while constructing a mapping)"],
    ),
    ("duplicate key", HEAD + "instance_count: 2\ninstance_count: 3\n", ["job.yaml:4:1: duplicate key 'instance_count' (also written on line 3; keep one)"]),
    ("unclosed flow", HEAD + "hyperparameters: {a: 1\n", ["job.yaml:3:18: YAML syntax error: expected ',' or '}', but got '<stream end>' (while parsing a flow mapping)"]),
    # --- numbers past their bounds -------------------------------------------------------------------
    ("instance_count 0", HEAD + "instance_count: 0\n", ["job.yaml:3:17: instance_count: must be at least 1, got 0"]),
    ("instance_count negative", HEAD + "instance_count: -4\n", ["job.yaml:3:17: instance_count: must be at least 1, got -4"]),
    ("instance_count 1001", HEAD + "instance_count: 1001\n", ["job.yaml:3:17: instance_count: must be at most 1000, got 1001 (split the work into several jobs)"]),
    ("instance_count 10000", HEAD + "instance_count: 10000\n", ["job.yaml:3:17: instance_count: must be at most 1000, got 10000 (split the work into several jobs)"]),
    (
        "instance_count 1e23",
        HEAD + "instance_count: 100000000000000000000000\n",
        ["job.yaml:3:17: instance_count: must be at most 1000, got 100000000000000000000000 (split the work into several jobs)"],
    ),
    (
        "instance_count huge",
        HEAD + "instance_count: " + "9" * 80 + "\n",
        ["job.yaml:3:17: instance_count: must be at most 1000, got a number of 80 digits (split the work into several jobs)"],
    ),
    ("instance_count 5000 digits", lambda: HEAD + "instance_count: " + "9" * 5000 + "\n", ["job.yaml:3:17: YAML syntax error: a number of 5000 digits is too long (at most 1000)"]),
    ("hp 2000-digit integer", lambda: HEAD + "hyperparameters:\n  seed: " + "1" * 2000 + "\n", ["job.yaml:4:9: YAML syntax error: a number of 2000 digits is too long (at most 1000)"]),
    ("instance_count float", HEAD + "instance_count: 1.0e+23\n", ["job.yaml:3:17: instance_count: must be an integer, got 1e+23"]),
    ("instance_count text", HEAD + "instance_count: two\n", ["job.yaml:3:17: instance_count: must be an integer, got 'two'"]),
    ("instance_count bool", HEAD + "instance_count: yes\n", ["job.yaml:3:17: instance_count: must be an integer, got True"]),
    ("max_run 0", HEAD + "max_run: 0\n", ["job.yaml:3:10: max_run: must be at least 1, got 0"]),
    ("max_run 29 days", HEAD + "max_run: 2505600\n", ["job.yaml:3:10: max_run: must be at most 2419200, got 2505600 (28 days is SageMaker's maximum)"]),
    ("volume_size huge", HEAD + "volume_size: 100000\n", ["job.yaml:3:14: volume_size: must be at most 16384, got 100000 (SageMaker volumes hold at most 16384 GB)"]),
    ("processes_per_host 0", HEAD + "scheduler_options:\n  processes_per_host: 0\n", [f"job.yaml:4:23: {PPH} a positive integer, got 0"]),
    ("processes_per_host 513", HEAD + "scheduler_options:\n  processes_per_host: 513\n", [f"job.yaml:4:23: {PPH} at most 512, got 513 (use more hosts (instance_count) instead)"]),
    ("processes_per_host 100000", HEAD + "scheduler_options:\n  processes_per_host: 100000\n", [f"job.yaml:4:23: {PPH} at most 512, got 100000 (use more hosts (instance_count) instead)"]),
    (
        "1000 hosts x 512 ranks in local mode",
        HEAD + "instance_count: 1000\nscheduler_options:\n  processes_per_host: 512\ndistribution:\n  torch_distributed:\n    enabled: true\n",
        ["job.yaml:3:17: instance_count: 1000 hosts x (1 runtime + 512 ranks) plan 513000 processes, and every simulated host runs on this "
         "machine; the limit is 1024 (use fewer hosts or ranks per host, or scheduler='sagemaker')"],
    ),
    ("hyperparameter name with a lone surrogate", HEAD + 'hyperparameters:\n  "a\\ud800": 1\n', ["job.yaml:3:1: hyperparameters.a\\ud800: name 'a\\ud800' is not valid Unicode (it holds a lone surrogate) (use letters, digits, '_', '-' and '.')"]),
    ("processes_per_host text", HEAD + "scheduler_options:\n  processes_per_host: '8'\n", [f"job.yaml:4:23: {PPH} a positive integer, got '8'"]),
    ("processes_per_host bool", HEAD + "scheduler_options:\n  processes_per_host: true\n", [f"job.yaml:4:23: {PPH} a positive integer, got True"]),
    ("processes_per_host list", HEAD + "scheduler_options:\n  processes_per_host: [1]\n", ["job.yaml:4:3: scheduler_options.processes_per_host: must be a positive integer, got [1]"]),
    (
        "mpi processes_per_host",
        HEAD + "distribution:\n  mpi:\n    enabled: true\n    processes_per_host: 100000\n",
        ["job.yaml:6:25: distribution.mpi.processes_per_host: must be at most 512, got 100000 (use more hosts (instance_count) instead)"],
    ),
    ("scheduler_options list", HEAD + "scheduler_options: [1]\n", ["job.yaml:3:1: scheduler_options: must be a mapping of option names to values, got list"]),
    # --- names: never a path ---------------------------------------------------------------------------
    ("base_job_name traversal", HEAD + "base_job_name: ../../../x\n", [f"job.yaml:3:16: base_job_name: {NAME_RULE} '../../../x'"]),
    ("base_job_name absolute", HEAD + "base_job_name: /etc/cron.d/x\n", [f"job.yaml:3:16: base_job_name: {NAME_RULE} '/etc/cron.d/x'"]),
    ("base_job_name slash", HEAD + "base_job_name: a/b\n", [f"job.yaml:3:16: base_job_name: {NAME_RULE} 'a/b'"]),
    ("base_job_name dot-dot", HEAD + "base_job_name: '..'\n", [f"job.yaml:3:16: base_job_name: {NAME_RULE} '..'"]),
    ("base_job_name leading hyphen", HEAD + "base_job_name: -x\n", [f"job.yaml:3:16: base_job_name: {NAME_RULE} '-x'"]),
    ("base_job_name trailing hyphen", HEAD + "base_job_name: x-\n", [f"job.yaml:3:16: base_job_name: {NAME_RULE} 'x-'"]),
    ("base_job_name underscore", HEAD + "base_job_name: my_job\n", [f"job.yaml:3:16: base_job_name: {NAME_RULE} 'my_job'"]),
    ("base_job_name space", HEAD + "base_job_name: my job\n", [f"job.yaml:3:16: base_job_name: {NAME_RULE} 'my job'"]),
    (
        "base_job_name too long",
        HEAD + f"base_job_name: {LONG_NAME}\n",
        ["job.yaml:3:16: base_job_name: must be 1-63 letters, digits and hyphens, starting and ending with a letter or digit, got 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa..."],
    ),
    ("base_job_name unicode", HEAD + "base_job_name: jöb\n", [f"job.yaml:3:16: base_job_name: {NAME_RULE} 'jöb'"]),
    ("base_job_name newline", HEAD + 'base_job_name: "a\\nb"\n', [f"job.yaml:3:16: base_job_name: {NAME_RULE} 'a\\nb'"]),
    ("base_job_name number", HEAD + "base_job_name: 12\n", ["job.yaml:3:16: base_job_name: must be a string or null, got 12 (put it in quotes so YAML reads it as text)"]),
    ("job_name traversal", HEAD + "job_name: ../x\n", [f"job.yaml:3:11: job_name: {NAME_RULE} '../x'"]),
    (
        "job_name too long",
        HEAD + f"job_name: {LONG_NAME}\n",
        ["job.yaml:3:11: job_name: must be 1-63 letters, digits and hyphens, starting and ending with a letter or digit, got 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa..."],
    ),
    ("job_name NUL", HEAD + 'job_name: "a\\0b"\n', ["job.yaml:3:11: job_name: must be 1-63 letters, digits and hyphens, starting and ending with a letter or digit, got 'a\\x00b'"]),
    # --- hyperparameters ---------------------------------------------------------------------------------
    ("hp NUL in value", HEAD + 'hyperparameters:\n  lr: "0.1\\0"\n', [f"job.yaml:4:7: hyperparameters.lr: {NUL_HINT}"]),
    ("hp NUL in list", HEAD + 'hyperparameters:\n  layers: ["a\\0"]\n', ["job.yaml:4:3: hyperparameters.layers: contains a NUL character, which cannot be passed to a process (remove it)"]),
    ("hp NUL in key", HEAD + 'hyperparameters:\n  "a\\0b": 1\n', ["job.yaml:4:11: hyperparameters.a\x00b: name 'a\\x00b' holds a NUL character (use letters, digits, '_', '-' and '.')"]),
    ("hp empty key", HEAD + 'hyperparameters:\n  "": 1\n', ["job.yaml:4:7: hyperparameters.: name '' is empty (use letters, digits, '_', '-' and '.')"]),
    ("hp NaN", HEAD + "hyperparameters:\n  lr: .nan\n", [f"job.yaml:4:7: hyperparameters.lr: NaN and infinity are not JSON; pass them as strings {HP_TYPES}"]),
    ("hp infinity", HEAD + "hyperparameters:\n  lr: .inf\n", [f"job.yaml:4:7: hyperparameters.lr: NaN and infinity are not JSON; pass them as strings {HP_TYPES}"]),
    (
        "hp minus infinity in list",
        HEAD + "hyperparameters:\n  lr: [1, -.inf]\n",
        ["job.yaml:4:3: hyperparameters.lr: NaN and infinity are not JSON; pass them as strings (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    (
        "hp date",
        HEAD + "hyperparameters:\n  start: 2024-01-01\n",
        ["job.yaml:4:10: hyperparameters.start: a value of type date is not JSON (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    (
        "hp timestamp",
        HEAD + "hyperparameters:\n  start: 2024-01-01 10:00:00\n",
        ["job.yaml:4:10: hyperparameters.start: a value of type datetime is not JSON (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    (
        "hp binary",
        HEAD + "hyperparameters:\n  blob: !!binary aGVsbG8=\n",
        ["job.yaml:4:9: hyperparameters.blob: a value of type bytes is not JSON (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    (
        "hp set",
        HEAD + "hyperparameters:\n  tags: !!set {a, b}\n",
        ["job.yaml:4:3: hyperparameters.tags: a value of type set is not JSON (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    (
        "hp date in mapping",
        HEAD + "hyperparameters:\n  sched:\n    at: 2024-01-01\n",
        ["job.yaml:4:3: hyperparameters.sched: a value of type date is not JSON (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    (
        "hp date as key",
        HEAD + "hyperparameters:\n  sched: {2024-01-01: 1}\n",
        ["job.yaml:4:3: hyperparameters.sched: a value of type date is not JSON (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    ("hp over 128 KiB", big_hyperparameters, ["job.yaml:3:1: hyperparameters: encode to 141290 bytes; the limit is 131072 (pass large data as an input channel or a file in source_dir)"]),
    (
        "hp one value over 128 KiB",
        lambda: HEAD + "hyperparameters:\n  blob: " + "x" * 140_000 + "\n",
        ["job.yaml:3:1: hyperparameters: encode to 140010 bytes; the limit is 131072 (pass large data as an input channel or a file in source_dir)"],
    ),
    (
        "hp nested 40 deep",
        lambda: nested_json(40),
        ["job.yaml:4:3: hyperparameters.x: nests deeper than 32 levels (or contains itself) (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    ("hp integer key", HEAD + "hyperparameters:\n  1: x\n", ["job.yaml:4:3: hyperparameters: keys must be strings '1'"]),
    ("hp as list", HEAD + "hyperparameters: [a, b]\n", ["job.yaml:3:1: hyperparameters: must be a mapping, got list"]),
    ("hp as text", HEAD + "hyperparameters: lr=0.1\n", ["job.yaml:3:18: hyperparameters: must be a mapping, got str"]),
    # --- environment ---------------------------------------------------------------------------------------
    ("env equals in key", HEAD + "environment:\n  A=B: x\n", [f"job.yaml:4:8: environment.A=B: 'A=B' is not a valid variable name {ENV_RULE}"]),
    ("env NUL in key", HEAD + 'environment:\n  "A\\0": x\n', [f"job.yaml:4:10: environment.A\0: 'A\\x00' is not a valid variable name {ENV_RULE}"]),
    ("env NUL in value", HEAD + 'environment:\n  A: "x\\0y"\n', [f"job.yaml:4:6: environment.A: {NUL_HINT}"]),
    ("env leading digit", HEAD + "environment:\n  1ABC: x\n", [f"job.yaml:4:9: environment.1ABC: '1ABC' is not a valid variable name {ENV_RULE}"]),
    ("env space", HEAD + "environment:\n  A B: x\n", [f"job.yaml:4:8: environment.A B: 'A B' is not a valid variable name {ENV_RULE}"]),
    ("env hyphen", HEAD + "environment:\n  A-B: x\n", [f"job.yaml:4:8: environment.A-B: 'A-B' is not a valid variable name {ENV_RULE}"]),
    ("env empty name", HEAD + 'environment:\n  "": x\n', [f"job.yaml:4:7: environment.: '' is not a valid variable name {ENV_RULE}"]),
    (
        "env SAGEMAKER_BASE_DIR",
        HEAD + "environment:\n  SAGEMAKER_BASE_DIR: /tmp\n",
        [f"job.yaml:4:23: environment.SAGEMAKER_BASE_DIR: {RESERVED} (it is where each host's /opt/ml tree lives; read it in the script instead)"],
    ),
    ("env TRAINING_JOB_NAME", HEAD + "environment:\n  TRAINING_JOB_NAME: x\n", [f"job.yaml:4:22: environment.TRAINING_JOB_NAME: {RESERVED} (it is set to the job's name)"]),
    ("env SMDDP_JOB_TOKEN", HEAD + "environment:\n  SMDDP_JOB_TOKEN: x\n", [f"job.yaml:4:20: environment.SMDDP_JOB_TOKEN: {RESERVED} (each job gets its own secret)"]),
    ("env SMDDP_HOST_ADDRESSES", HEAD + "environment:\n  SMDDP_HOST_ADDRESSES: '{}'\n", [f"job.yaml:4:25: environment.SMDDP_HOST_ADDRESSES: {RESERVED} (the scheduler maps host names to addresses)"]),
    ("env SMDDP_ERROR_FILE", HEAD + "environment:\n  SMDDP_ERROR_FILE: /x\n", [f"job.yaml:4:21: environment.SMDDP_ERROR_FILE: {RESERVED} (the runtime sets one per rank)"]),
    ("env number value", HEAD + "environment:\n  A: 1\n", ["job.yaml:4:6: environment.A: must be a string, got 1 (quote the value)"]),
    ("env list value", HEAD + "environment:\n  A: [1]\n", ["job.yaml:4:3: environment.A: must be a string, got [1] (quote the value)"]),
    ("env over 128 KiB", big_environment, ["job.yaml:3:1: environment: takes 140730 bytes; the limit is 131072 (pass large values in a file in source_dir)"]),
    ("env as list", HEAD + "environment: [A=1]\n", ["job.yaml:3:1: environment: must be a mapping, got list"]),
    (
        "env several at once",
        HEAD + 'environment:\n  A=B: "\\0"\n  SAGEMAKER_BASE_DIR: /\n',
        [
            f"job.yaml:4:8: environment.A=B: 'A=B' is not a valid variable name {ENV_RULE}",
            f"job.yaml:4:8: environment.A=B: {NUL_HINT}",
            f"job.yaml:5:23: environment.SAGEMAKER_BASE_DIR: {RESERVED} (it is where each host's /opt/ml tree lives; read it in the script instead)",
        ],
    ),
    # --- code and paths ---------------------------------------------------------------------------------------
    (
        "entry_point climbs out",
        "entry_point: ../train.py\nsource_dir: src\ninstance_type: local\n",
        ["job.yaml:1:14: entry_point: '../train.py' must be a relative path of letters, digits, '.', '_', '+', '-' without '.' or '..' parts"],
    ),
    ("source_dir missing", "entry_point: train.py\nsource_dir: nowhere\ninstance_type: local\n", ["job.yaml:2:13: source_dir: directory 'nowhere' does not exist"]),
    ("entry_point missing", "entry_point: nothere.py\ninstance_type: local\n", ["job.yaml:1:14: entry_point: file 'nothere.py' does not exist (give the script's path, or set source_dir)"]),
    (
        "input channel traversal",
        HEAD + "inputs:\n  ../x: data\n",
        ["job.yaml:4:9: inputs.../x: channel names use letters, digits, '.', '-' and '_' (at most 64)", "job.yaml:4:9: inputs.../x.s3_data: local data 'data' does not exist"],
    ),
    ("input channel name NUL", HEAD + 'inputs:\n  "a\\0": s3://b/k\n', ["job.yaml:4:10: inputs.a\x00: channel names use letters, digits, '.', '-' and '_' (at most 64)"]),
    ("NUL in output_path", HEAD + 'output_path: "out\\0"\n', ["job.yaml:3:14: output_path: contains a NUL character (remove it)"]),
    ("NUL in role", HEAD + 'role: "arn\\0"\n', ["job.yaml:3:7: role: contains a NUL character (remove it)"]),
    (
        "NUL in a local input",
        HEAD + 'inputs:\n  train: "data\\0"\n',
        ["job.yaml:4:10: inputs.train.s3_data: local data 'data\\x00' does not exist", "job.yaml:4:10: inputs.train.s3_data: contains a NUL character (remove it)"],
    ),
    (
        "input path too long",
        lambda: HEAD + "inputs:\n  train: " + "y" * 5000 + "\n",
        [
            "job.yaml:4:10: inputs.train.s3_data: local data 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy' does not exist"
        ],
    ),
    # --- several problems at once: all reported ---------------------------------------------------------
    (
        "everything at once",
        HEAD + "instance_count: 5000\nbase_job_name: ../x\nhyperparameters: {a: .nan}\nenvironment: {A=B: x}\n",
        [
            "job.yaml:3:17: instance_count: must be at most 1000, got 5000 (split the work into several jobs)",
            "job.yaml:4:16: base_job_name: must be 1-63 letters, digits and hyphens, starting and ending with a letter or digit, got '../x'",
            "job.yaml:5:22: hyperparameters.a: NaN and infinity are not JSON; pass them as strings (use strings, numbers, booleans, null, lists and mappings of them)",
            "job.yaml:6:20: environment.A=B: 'A=B' is not a valid variable name (use letters, digits and '_', not starting with a digit; no '=', spaces or NUL)",
        ],
    ),
]
