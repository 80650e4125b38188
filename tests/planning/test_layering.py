"""The planner is stdlib only: the CLI and the estimator plan without torch (or boto3, docker) installed."""

import subprocess
import sys

BLOCKED = ("torch", "boto3", "botocore", "docker")


def test_plan_runs_with_torch_blocked():
    code = (
        "import sys\n"
        f"for name in {BLOCKED!r}: sys.modules[name] = None\n"
        "import smddp_sdk.planning, smddp_sdk.planning.profile_io\n"
        "from click.testing import CliRunner\nfrom smddp_sdk.cli.main import cli\n"
        "r = CliRunner().invoke(cli, ['plan', '--instance-type', 'ml.p4d.24xlarge', '--compute-ms', '100',"
        " '--gradient-mb', '100', '--instances', '2'])\n"
        "assert r.exit_code == 0, r.output\nprint('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
