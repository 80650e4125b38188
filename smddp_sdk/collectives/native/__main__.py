import sys

from smddp_sdk.collectives.native import main

sys.exit(main(sys.argv[1:]))
