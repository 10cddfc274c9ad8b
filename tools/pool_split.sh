#!/usr/bin/env bash
# Do the pool runs of --attnperf-processes time short cases as the main process does? From the
# repo root, on an H100 or H200:  bash tools/pool_split.sh
# The B=1 decode cases (one recurrent step of each linear family, fla's and PyTorch's; SDPA over a
# 1K cache) are recorded in one process into a scratch copy of this card's baseline file, then
# gated pooled over 3 processes; the table gives each process's median, the main one first. Logs
# and JSON go to $OUT/pool-split.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR="$PWD/.triton-cache"
OUT="${OUT:-/tmp/attnperf-out}"
mkdir -p "$OUT" "$TRITON_CACHE_DIR"
if [ -z "${WHEELS_READY:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site WHEELS_READY=1
fi
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
case "$name" in *H200*) HW=h200 ;; *H100*) HW=h100 ;; *) echo "not an H100 or H200: $name" >&2; exit 2 ;; esac
SCRATCH=$(mktemp -d)
cp -r "baselines/$HW.yaml" "baselines/$HW.autotune" "$SCRATCH/"
IDS=()
for fam in linear_attn gla simple_gla gdn; do
  for k in fla-fused-recurrent torch-recurrent; do
    IDS+=("suites/test_decode.py::test_linear_decode[b1-h16-t1-d128-bf16-${fam}_decode-$k-fwd]")
  done
done
for k in sdpa sdpa-flash sdpa-cudnn sdpa-repeat-kv; do
  IDS+=("suites/test_decode.py::test_softmax_decode[b1-h32-kv8-t1-cache1k-d128-causal-bf16-$k-fwd]")
done
LOGS=$(mktemp -d)
P=(python3 -m pytest -p no:cacheprovider -q --tb=line --timeout=240 --hw="$HW" --attnperf-baselines="$SCRATCH")
"${P[@]}" "${IDS[@]}" --update-baselines --attnperf-processes=1 > "$LOGS/record.log" 2>&1
echo "recorded in one process: $(tail -1 "$LOGS/record.log")"
"${P[@]}" "${IDS[@]}" --attnperf-processes=3 --benchmark-json="$LOGS/pooled.json" > "$LOGS/pooled.log" 2>&1
echo "gated over 3 processes: $(tail -1 "$LOGS/pooled.log")"
python3 - "$LOGS/pooled.json" <<'EOF'
import json, sys
print(f"{'case':<58} {'main':>6} {'pool 1':>7} {'pool 2':>7}  us")
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    medians = b["extra_info"].get("attnperf_process_medians_ms") or []
    case = b["fullname"].split("[", 1)[1].rstrip("]").replace("-bf16", "").replace("-fwd", "")
    print(f"{case:<58} " + " ".join(f"{1e3 * m:>7.2f}" for m in medians))
EOF
(cd "$LOGS" && tar czf "$OUT/pool-split.tgz" .)
