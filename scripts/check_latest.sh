#!/usr/bin/env bash
# Re-run the parity tests marked `latest` against the NEWEST transformers (not the pinned one), so
# that upstream drift is seen, not suffered. Makes a throw-away venv; not run in CI.
#   usage: scripts/check_latest.sh            (from the repository root)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "$root" transformers pytest hypothesis scipy sympy
"$venv/bin/python" -c "import transformers; print('transformers', transformers.__version__)"
cd "$root"
"$venv/bin/python" -m pytest -m latest -q -p no:cacheprovider tests/test_hf_families.py
