#!/usr/bin/env bash
# Re-run the parity tests marked `latest` against the NEWEST transformers (not the pinned one in
# constraints.txt), so that upstream drift is seen, not suffered. Not run in CI.
#
#   scripts/check_latest.sh           a throw-away venv that reuses this environment's torch (and
#                                     the other installed packages) under the newest transformers
#   scripts/check_latest.sh --fresh   a throw-away venv with everything installed anew, unpinned
#
# Run from anywhere; uses the python on PATH (the project's venv, for the default mode).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
venv="$tmp/venv"

if [[ "${1:-}" == "--fresh" ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "$root" transformers pytest hypothesis scipy sympy
else
  site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  python -m venv "$venv"
  # the current environment's packages (torch, …) after the venv's own: a newer transformers
  # installed into the venv shadows the pinned one
  vsite="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$site" > "$vsite/_liepos_base_env.pth"
  "$venv/bin/pip" install -q --upgrade --upgrade-strategy only-if-needed transformers
fi

"$venv/bin/python" -c "import transformers, torch; print('transformers', transformers.__version__, '| torch', torch.__version__)"
cd "$root"
PYTHONPATH="$root/src" "$venv/bin/python" -m pytest -m latest -q -p no:cacheprovider \
  tests/test_latest_upstream.py tests/test_hf_families.py tests/test_to_hf.py
