"""``python -m liepos.explore …`` (and ``torchrun -m liepos.explore …``): the explore subcommand."""

import argparse
import sys

from liepos.explore import configure, run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="liepos explore", description="train small models across the design space")
    configure(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
