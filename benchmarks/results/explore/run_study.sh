#!/usr/bin/env bash
# The explore study of docs/guide/explore.md. Run from the repository root:
#   bash benchmarks/results/explore/run_study.sh [OUT]            # the full study
#   REDUCED=1 bash benchmarks/results/explore/run_study.sh [OUT]  # the subset the guide reports
# Resumable: rerun the same command; finished runs are skipped and an interrupted one continues from
# its last checkpoint. Three chains run side by side (one CPU thread each); each phase writes its folder
# and its wall time to times.txt.
set -euo pipefail
OUT=${1:-benchmarks/results/explore/study}
SEEDS=${SEEDS:-0,1,2,3,4}
PY=${PY:-python}
# The rows: one list each. A name this liepos cannot parse is left out (rows other branches add).
ROWS="nope decay rope xpos alibi jordan3 growth learn learn:rope"
NEW_ROWS="schedule:rnope_swa schedule:ssmax cope_clipped rope_clipped learn:per_head"
FREE="learn:rope learn:nope learn:random"  # learned generators with their own learning rate (--gen-lr)
if [ -n "${REDUCED:-}" ]; then  # the subset that fits an afternoon of a 2-core machine; each list can be set
  ROWS_PASSKEY=${ROWS_PASSKEY-"nope decay rope alibi jordan3"}
  ROWS_LM=${ROWS_LM-"nope rope alibi"}
  ROWS_KJV=${ROWS_KJV-""}
  [ -n "${WITH_NEW:-}" ] || NEW_ROWS=""  # WITH_NEW=1 adds the design-space rows to every phase
else
  ROWS_PASSKEY="$ROWS"; ROWS_LM="$ROWS"; ROWS_KJV="$ROWS"
fi
rows() {  # the names this liepos can parse, comma-separated
  $PY - "$@" <<'PY'
import sys
from liepos.explore.spec import split_heads
names = []
for n in sys.argv[1:]:
    try:
        split_heads(n, 4)
        names.append(n)
    except ValueError:
        print(f"row {n!r} is not in this catalogue: left out", file=sys.stderr)
print(",".join(names))
PY
}
MAPS=$($PY -c "import liepos as lp; print(','.join(lp.scaling.SCALINGS))")
LM_MAPS=${LM_MAPS:-ntk,dynamic,yarn}
LM="--task lm --d-model 64 --layers 2 --heads 4 --steps 200 --batch-size 16 --train-len 64 --eval-lens 64,128,256,512,1024 --eval-tokens 8192"
COMMON="--seed $SEEDS --threads 1 --no-progress"
export OMP_NUM_THREADS=1
t0=$(date +%s)
phase() {  # name, args...
  local name=$1; shift
  local s=$(date +%s)
  $PY -m liepos.explore "$@" $COMMON --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "$name: $(( $(date +%s) - s )) s" | tee -a "$OUT/times.txt"
}
mkdir -p "$OUT"
echo "started $(date -u +%FT%TZ): rows $ROWS $NEW_ROWS; seeds $SEEDS; reduced ${REDUCED:-no}" | tee -a "$OUT/times.txt"
{
  phase passkey --quick --task passkey --encodings "$(rows $ROWS_PASSKEY $NEW_ROWS)" --eval-scaling "$MAPS"
  [ -n "${REDUCED:-}" ] || phase lookup --quick --encodings "$(rows $ROWS $NEW_ROWS)" --eval-scaling "$MAPS"
} &
A=$!
{
  phase lm $LM --encodings "$(rows $ROWS_LM $NEW_ROWS)" --eval-scaling "$LM_MAPS"
  [ -n "${REDUCED:-}" ] || phase learned_lm $LM --encodings "$(rows $FREE)" --gen-lr 0.05 --gen-schedule constant
} &
B=$!
{
  phase learned_passkey --quick --task passkey --encodings "$(rows $FREE)" --gen-lr 0.05 --gen-schedule constant
  [ -z "$ROWS_KJV" ] || phase kjv $LM --corpus kjv --encodings "$(rows $ROWS_KJV $NEW_ROWS)" --eval-scaling "$LM_MAPS"
} &
C=$!
wait $A $B $C
echo "study wall time: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/times.txt"
$PY - "$OUT" <<'PY'
import json, sys
from pathlib import Path
from liepos.explore.figures import plot_map
out = Path(sys.argv[1])
res = [json.loads((out / t / "results.json").read_text()) for t in ("passkey", "lookup", "lm", "kjv")
       if (out / t / "results.json").exists()]
plot_map(res, out / "map.png")
print(f"wrote {out / 'map.png'}")
PY
