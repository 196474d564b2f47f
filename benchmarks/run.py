"""Run the benchmark suite next to this file: ``python benchmarks/run.py [--quick] [--out DIR] [--threads N]``.

The same as ``liepos bench`` (its options), with ``--suite`` set to ``benchmarks/bench.py`` here.
"""

import sys
from pathlib import Path

from liepos.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--suite", str(Path(__file__).with_name("bench.py")), *sys.argv[1:]]))
