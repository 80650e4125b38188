"""``python -m smddp_sdk.runtime``: run this host's share of a training job (see docs/runtime.md)."""

import sys

from smddp_sdk.runtime.main import main

if __name__ == "__main__":
    sys.exit(main())
