"""Run the benchmark suite: ``python benchmarks/run.py [--quick]`` (same as ``liepos bench``)."""

import argparse
import sys

from liepos import bench

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    bench.configure(p)
    sys.exit(bench.run(p.parse_args()))
