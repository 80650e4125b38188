#!/usr/bin/env python3
"""Write docs/cli.md and docs/job-file.md from the code; with --check, fail if they differ instead.

Usage: python3 scripts/gen_docs.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from smddp_sdk.cli.docs import cli_reference  # noqa: E402
from smddp_sdk.cli.main import cli  # noqa: E402
from smddp_sdk.config.docs import job_file_reference  # noqa: E402


def pages() -> dict[Path, str]:
    return {ROOT / "docs" / "cli.md": cli_reference(cli), ROOT / "docs" / "job-file.md": job_file_reference()}


def main(argv: list[str]) -> int:
    stale = [path for path, text in pages().items() if not path.exists() or path.read_text(encoding="utf-8") != text]
    if "--check" in argv:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is out of date: run python3 scripts/gen_docs.py", file=sys.stderr)
        return 1 if stale else 0
    for path, text in pages().items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
