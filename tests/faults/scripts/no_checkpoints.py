"""A script with no checkpoint logic: sleeps, then succeeds or (``--fail``) raises."""

import argparse
import time

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=3.0)
parser.add_argument("--fail", type=int, default=0)
args = parser.parse_args()
time.sleep(args.seconds)
if args.fail:
    raise ValueError("the script failed on purpose")
print("done", flush=True)
