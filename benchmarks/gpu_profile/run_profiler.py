"""`fleetpilot profile` without the rest of the CLI's imports (the GPU machine lacks the cluster clients)."""
import argparse
import sys

from fleetpilot.profiler import cli

parser = argparse.ArgumentParser(prog="fleetpilot")
cli.add_parser(parser.add_subparsers())
args = parser.parse_args(["profile", *sys.argv[1:]])
sys.exit(args.func(args))
