"""``python -m liepos.explore …`` (and ``torchrun -m liepos.explore …``): the explore subcommand."""

import sys

from liepos.cli.explore import main

if __name__ == "__main__":
    sys.exit(main())
