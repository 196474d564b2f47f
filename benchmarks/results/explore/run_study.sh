#!/usr/bin/env bash
# The explore study of docs/guide/explore.md. Run from the repository root:
#   bash benchmarks/results/explore/run_study.sh [OUT]
# Resumable: rerun the same command; finished runs are skipped and an interrupted one continues from
# its last checkpoint. Two chains run side by side (one CPU thread each); each phase writes its folder.
set -euo pipefail
OUT=${1:-benchmarks/results/explore/study}
SEEDS=${SEEDS:-0,1,2,3,4}
PY=${PY:-python}
# The rows: one list. A name that is not in this liepos' catalogue is left out (rows other branches add).
ROWS="nope decay rope xpos alibi jordan3 growth learn learn:rope"
NEW_ROWS="rnope_swa ssmax cope_clipped rope_clipped"
ENC=$($PY - $ROWS $NEW_ROWS <<'PY'
import sys
import liepos as lp
from liepos.explore.spec import parse_part
names = []
for n in sys.argv[1:]:
    try:
        parse_part(n)
        names.append(n)
    except ValueError:
        print(f"row {n!r} is not in this catalogue: left out", file=sys.stderr)
print(",".join(names))
PY
)
FREE="learn:rope,learn:nope,learn:random"  # learned generators with their own learning rate
MAPS=$($PY -c "import liepos as lp; print(','.join(lp.scaling.SCALINGS))")
LM="--task lm --d-model 64 --layers 2 --heads 4 --steps 300 --batch-size 16 --train-len 64 --eval-lens 64,128,256,512,1024 --eval-tokens 16384"
COMMON="--seed $SEEDS --threads 1 --no-progress"
export OMP_NUM_THREADS=1
echo "rows: $ENC; maps: $MAPS; seeds: $SEEDS"
t0=$(date +%s)
phase() {  # name, args...
  local name=$1; shift
  local s=$(date +%s)
  $PY -m liepos.explore "$@" $COMMON --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "$name: $(( $(date +%s) - s )) s" | tee -a "$OUT/times.txt"
}
mkdir -p "$OUT"
{
  phase passkey --quick --task passkey --encodings "$ENC" --eval-scaling "$MAPS" --eval-tokens 8192
  phase lm $LM --encodings "$ENC" --eval-scaling "$MAPS"
  phase learned_lm $LM --encodings "$FREE" --gen-lr 0.05 --gen-schedule constant
} &
A=$!
{
  phase lookup --quick --encodings "$ENC" --eval-scaling "$MAPS" --eval-tokens 8192
  phase learned_passkey --quick --task passkey --encodings "$FREE" --gen-lr 0.05 --gen-schedule constant --eval-tokens 8192
  phase kjv $LM --corpus kjv --encodings "$ENC"
} &
B=$!
wait $A $B
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
