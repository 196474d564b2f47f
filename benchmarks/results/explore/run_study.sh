#!/usr/bin/env bash
# The explore study of docs/guide/explore.md: two tasks, nine encodings, three seeds, one CPU thread;
# then the corners on lookup, and "the map" of both tasks. Resumable: rerun the same command and
# finished runs are skipped. Run from the repository root.
set -euo pipefail
OUT=${1:-benchmarks/results/explore/study}
ENC="nope,decay,rope,xpos,alibi,jordan3,growth,learn,learn:rope"
MAPS="linear,ntk,dynamic,yarn,llama3"
export OMP_NUM_THREADS=1
start=$(date +%s)
python -m liepos.explore --quick --encodings "$ENC" --eval-scaling "$MAPS" --seed 0,1,2 --eval-tokens 8192 \
    --threads 1 --no-progress --out "$OUT/lookup"
mid=$(date +%s)
python -m liepos.explore --task lm --encodings "$ENC" --eval-scaling "$MAPS" --seed 0,1,2 --d-model 64 --layers 2 \
    --heads 4 --steps 300 --batch-size 32 --train-len 64 --eval-lens 64,128,256,512,1024 --eval-tokens 16384 \
    --threads 1 --no-progress --out "$OUT/lm"
end=$(date +%s)
echo "study wall time: lookup $((mid - start)) s, lm $((end - mid)) s, total $((end - start)) s"
# the corners: Jordan sizes, rate sweeps, growth rates, mixtures (lookup, the quick budget)
python -m liepos.explore --quick --encodings "jordan2,jordan4,jordan5,decay:0.01,decay:0.1,xpos:scale=64,growth:0.01,growth:0.2,rope+decay,rope|alibi" \
    --seed 0,1,2 --eval-tokens 8192 --threads 1 --no-progress --out "$OUT/corners"
echo "corners wall time: $(($(date +%s) - end)) s"
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
from liepos.explore.report import plot_map
out = Path(sys.argv[1])
plot_map([json.loads((out / t / "results.json").read_text()) for t in ("lookup", "lm")], out / "map.png")
print(f"wrote {out / 'map.png'}")
PY
