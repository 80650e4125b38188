"""``python -m smddp_sdk.cli`` runs ``smddp-launch``."""

from smddp_sdk.cli.main import main

main()
