#!/usr/bin/env bash
# Maintainers' runs on an H200, from the repo root:
#   bash tools/h200.sh preflight | record | record-linear | gate | noise | pair | short | full | check | power | integrity |
#     inventory | memory | memory-noise | models | models-gate | decode | history | pool-split | catalogue
# Logs, JSON and the baseline file go to $OUT; a mode that writes many files (history, models,
# decode) packs them into one .tgz, since a device call brings back at most 8. fla comes from wheels carried in .whl/ and
# Triton's cache (autotune results, compiled kernels) from .triton-cache/ (both git-ignored).
set -uo pipefail
# HW (default: h100 on an H100, else h200): the card the record, gate, models, models-gate and
# pool-split modes record and gate, baselines/$HW.yaml; every other mode is the H200's, and refuses
# another HW rather than mix two cards' files
HW="${HW:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | grep -q H100 && echo h100 || echo h200)}"
case "$HW:${1:-}" in
  h200:* | *:record | *:gate | *:models | *:models-gate | *:pool-split | *:catalogue) ;;
  *) echo "HW=$HW: only the record, gate, models, models-gate and pool-split modes take another card than h200" >&2
     exit 2 ;;
esac
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR="$PWD/.triton-cache"
OUT="${OUT:-/tmp/attnperf-out}"
mkdir -p "$OUT" "$TRITON_CACHE_DIR"
if [ -z "${WHEELS_READY:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site WHEELS_READY=1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
PYTEST=(python3 -m pytest -p no:cacheprovider -q --tb=short -rs --timeout=240)
# the model cases of the models and models-gate modes: the committed configs, TP degrees (TP,
# default 1,8), training shapes (TRAIN, default none)
# shellcheck disable=SC2054  # the commas are in one option's value
MODEL_OPTS=(--hw="$HW" --attnperf-model=llama3-8b,mistral-7b,qwen3-next-80b-a3b --attnperf-tp="${TP:-1,8}"
            --attnperf-model-train="${TRAIN:-none}")

keep_cache() {  # autotune results travel back, so the next machine skips autotuning; the compiled
  # kernels too while the whole cache stays under 40 MiB (carry takes 64 MiB in all), so it also
  # skips compiling (Triton's cache key holds the GPU target and Triton's version)
  local kib; kib=$(du -sk "$TRITON_CACHE_DIR" | cut -f1)
  if [ "$kib" -lt 40960 ]; then
    (cd "$TRITON_CACHE_DIR" && tar czf "$OUT/autotune.tgz" .)
  else
    (cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' -print0 | tar czf "$OUT/autotune.tgz" --null -T -)
  fi
  echo "triton cache: ${kib} KiB"; ls -la "$OUT/autotune.tgz"
}

# RESUME=1: calls in turn on one machine kept warm (it goes back after 30 s idle, too soon to commit
# between calls) record one selection: each starts from the last one's file and choices, kept on the
# machine in $RESUMED/<mode>, since each call copies the working tree anew. The committed file's
# hash is kept with them: a call whose committed file differs (a new commit) does not resume
RESUMED=/tmp/attnperf-resume/${1:-none}
COMMITTED_SHA=$(sha256sum "baselines/$HW.yaml" 2>/dev/null | cut -d' ' -f1)
resume_restore() {  # $1: the baselines folder the recording writes into
  [ -n "${RESUME:-}" ] && [ -e "$RESUMED/$HW.yaml" ] || return 0
  if [ "$(cat "$RESUMED/committed.sha" 2>/dev/null)" != "$COMMITTED_SHA" ]; then
    echo "not resumed: baselines/$HW.yaml changed since the recording kept in $RESUMED (commit that one first)"
    return 0
  fi
  cp "$RESUMED/$HW.yaml" "$1/$HW.yaml"
  if [ -d "$RESUMED/$HW.autotune" ]; then rm -rf "$1/$HW.autotune"; cp -r "$RESUMED/$HW.autotune" "$1/"; fi
  echo "resumed from the last call's recording: $(grep -c 'run_medians_ms' "$1/$HW.yaml") entries"
}
resume_save() {
  [ -n "${RESUME:-}" ] || return 0
  rm -rf "$RESUMED"; mkdir -p "$RESUMED"; cp "$1/$HW.yaml" "$RESUMED/"
  echo "$COMMITTED_SHA" > "$RESUMED/committed.sha"
  if [ -d "$1/$HW.autotune" ]; then cp -r "$1/$HW.autotune" "$RESUMED/"; fi
}
left_of() {  # seconds left of BUDGET ($1) since $2, at least 30 (timeout reads 0 as no limit)
  local left=$(( $1 - (SECONDS - $2) ))
  echo $(( left < 30 ? 30 : left ))
}
record_for() {  # $1: seconds; $2: the log; the rest: pytest's arguments. A recording (--update-baselines)
  # stopped by SIGINT after $1 s and killed 30 s later. Alive 25 s after its SIGINT it gets SIGABRT:
  # pytest's faulthandler writes every thread's stack into the log, which says where it did not stop
  # (no core file; the watcher holds no output open, and its sleep ends with it)
  local left=$1 log=$2 watcher; shift 2
  ulimit -c 0
  ( trap 'kill $s 2>/dev/null; exit 0' TERM; sleep $(( left + 25 )) & s=$!; wait $s
    for pid in $(pgrep -f -- "-m pytest .*--update-baselines"); do
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = timeout ] || kill -ABRT "$pid" 2>/dev/null
    done ) >/dev/null 2>&1 &
  watcher=$!
  timeout -s INT -k 30 "$left" "${PYTEST[@]}" "$@" --update-baselines > "$log" 2>&1
  kill "$watcher" 2>/dev/null
  return 0
}
missing_ids() {  # $1: the baseline file; the rest: a pytest selection. Its node ids without an entry, one a line
  local file=$1 ids; shift
  if ! ids=$("${PYTEST[@]}" "$@" --collect-only 2>"$OUT/record-collect.err"); then
    echo "collecting the selection failed:" >&2; printf '%s\n' "$ids" | tail -n 15 >&2; tail -n 15 "$OUT/record-collect.err" >&2
    return 1
  fi
  printf '%s\n' "$ids" | python3 tools/missing.py "$file"
}

case "${1:-}" in
  preflight)  # tools/device/preflight.py: the torch guard around each first use of a CUDA subsystem, the
    # checked and timed path of a few built-ins per family on small shapes, and two cheats that must
    # fail (FULL=1: every built-in); before a whole run on a new machine or stack. On a fresh H200
    # Part A's SDPA, profiler and graph steps took 10 s, and fla's first calls (compiled, and
    # autotuned with an empty Triton cache) had not returned when a 150 s limit on the whole mode,
    # wheels' install included, stopped it: give it 300 s or more
    python3 tools/device/preflight.py ${FULL:+--full} 2>&1 | tee "$OUT/preflight.log" | tail -n 60 ;;
  record | record-linear)  # the whole suite (record) or suites/test_linear.py (record-linear)
    # recorded into baselines/$HW.yaml (record-linear: the H200's); EXTRA: more pytest arguments
    # (EXTRA=--attnperf-opt-in=precision records the precision rows), K: a -k selection. BUDGET
    # (default 520 s, record-linear 480) counts from the mode's start; stopped there, the run gets
    # 30 s to end before it is killed (record_for; keep the call's timeout_s 90 s above BUDGET: the
    # grace, the merge's start-up, the archive). A run killed leaves its entries journaled and each
    # recorded case's choices written, and a collect-only update merges that journal into the file;
    # the file and its autotune choices come back as recorded.tgz.
    # MISSING=1 runs only the selected cases that have no entry in the file yet, so calls in turn
    # record a selection too long for one (commit what each brings back before the next, or keep the
    # machine warm with RESUME=1). SEED=<card> first copies that card's recorded choices into
    # baselines/$HW.autotune for the hash folders it lacks (tools/seed_choices.py: on the same stack
    # an sm_90 card's Triton hashes are another's), so fla's kernels time those configurations
    # instead of autotuning anew; the summary's "autotuned in this run" line says whether any
    # kernel still autotuned
    t0=$SECONDS
    SUITE=suites/ BUDGET_DEFAULT=520
    [ "$1" = record-linear ] && SUITE=suites/test_linear.py BUDGET_DEFAULT=480
    resume_restore baselines
    if [ -n "${SEED:-}" ]; then
      python3 tools/seed_choices.py "baselines/$SEED.autotune" "baselines/$HW.autotune" \
        --skip-source families/models/ || exit 1  # the model cases: the models mode records their own
    fi
    SEL=("$SUITE"); [ -n "${K:-}" ] && SEL+=(-k "$K")
    if [ -n "${MISSING:-}" ]; then
      # shellcheck disable=SC2086
      ids=$(missing_ids "baselines/$HW.yaml" "${SEL[@]}" --hw="$HW" ${EXTRA:-}) || exit 1
      mapfile -t SEL < <(printf '%s\n' "$ids" | grep .)
      echo "${#SEL[@]} selected cases without an entry"
    fi
    # shellcheck disable=SC2086
    [ "${#SEL[@]}" -gt 0 ] && record_for "$(left_of "${BUDGET:-$BUDGET_DEFAULT}" "$t0")" "$OUT/$1.log" "${SEL[@]}" \
      --hw="$HW" --benchmark-disable ${EXTRA:-} && tail -n 3 "$OUT/$1.log"
    "${PYTEST[@]}" "$SUITE" --hw="$HW" --update-baselines --collect-only ${EXTRA:-} 2>&1 \
      | grep "^baselines:" | tee "$OUT/record-merge.log"
    grep -E "^FAILED|^ERROR|autotuned in this run" "$OUT/$1.log" 2>/dev/null | cut -c1-200 | head -n 30
    resume_save baselines
    tar czf "$OUT/recorded.tgz" "baselines/$HW.yaml" "baselines/$HW.autotune"; keep_cache ;;
  gate)
    # every test's setup, call and teardown time in the JUnit file (where the wall time goes, test by
    # test), the slowest 40 on the terminal; EXTRA: more pytest arguments, split on spaces
    # (EXTRA=--attnperf-opt-in=precision gates the precision rows too)
    # shellcheck disable=SC2086
    timeout -s INT "${BUDGET:-540}" "${PYTEST[@]}" suites/ --hw="$HW" --benchmark-json="$OUT/gate.json" \
      --junitxml="$OUT/gate.xml" -o junit_duration_report=total --durations=40 \
      ${EXTRA:-} ${K:+-k "$K"} 2>&1 | tee "$OUT/gate.log"
    keep_cache ;;
  noise)  # STAGES=record,steady NOISE_ARGS="--runs 3" [SUITE=suites/test_linear.py]
    # [EXTRA="--durations=20"] (more pytest arguments) [FROM_BASELINES=1] (a new work folder starts
    # with baselines/h200.yaml, so steady runs gate against the committed recordings); the work
    # folder ($WORK, default noise-work) travels back as $WORK.tgz
    WORK="${WORK:-noise-work}"
    if [ -n "${FROM_BASELINES:-}" ] && [ ! -e "$WORK/h200.yaml" ]; then  # gate against the committed file
      mkdir -p "$WORK" && cp baselines/h200.yaml "$WORK/"
    fi
    # --time-limit starts no run likely to end past BUDGET less 20 s (for the tar and the cache);
    # at BUDGET the run is interrupted and gets up to 20 s more to write its reports, so keep the
    # call's timeout_s 40 s or more above BUDGET. EXTRA is split on spaces: write a -k expression
    # without them, e.g. -k not(naive)
    BUDGET="${BUDGET:-540}"
    timeout -s INT "$BUDGET" python3 -m noise_benchmark.benchmark --workdir "$WORK" --stages "${STAGES:?STAGES=...}" \
      --time-limit $(( BUDGET > 40 ? BUDGET - 20 : BUDGET )) \
      ${NOISE_ARGS:-} -- "${SUITE:-suites/test_softmax.py}" --hw=h200 --attnperf-tolerance=1.5% ${EXTRA:-} 2>&1 \
      | tee "$OUT/noise-${STAGES//,/-}.log"
    tar czf "$OUT/$WORK.tgz" "$WORK"; [ "${KEEP_CACHE:-1}" = 1 ] && keep_cache ;;
  pair)  # two noise jobs at once, one per GPU of an nvidia-h200-x2 (device time is the lease's
    # wall time, not per GPU): each argument is a line of shell assignments for `noise`, e.g.
    #   bash tools/h200.sh pair 'WORK=full-a SUITE=suites/ STAGES=steady' 'WORK=full-b SUITE=suites/ STAGES=steady'
    # Job i runs on CUDA_VISIBLE_DEVICES=i, writes under $OUT/g<i>, works in noise-work-g<i> unless
    # its line sets WORK (two jobs must not share a work folder); job 0 alone keeps the Triton
    # cache (shared by both; Triton writes its entries atomically)
    shift; i=0
    for job in "$@"; do
      ( export CUDA_VISIBLE_DEVICES=$i OUT="$OUT/g$i" KEEP_CACHE=$(( i == 0 )) WORK="noise-work-g$i"; mkdir -p "$OUT"
        eval "export $job"; bash "$0" noise >/dev/null 2>&1 ) &
      i=$(( i + 1 ))
    done
    wait
    for log in "$OUT"/g*/noise-*.log; do echo "== $log"; tail -n "${TAIL:-30}" "$log"; done ;;
  short)  # the cases whose committed centre is under 50 us (those --attnperf-processes times in
    # several processes), steady runs against the committed file on both GPUs of an x2 at once,
    # --attnperf-processes=${PROCESSES:-3}, as many runs as fit in BUDGET (default 540 s); each
    # GPU's work folder (noise-work-p<gpu>$TAG, with any worker logs kept) travels back as a .tgz
    BUDGET="${BUDGET:-540}"
    IDS=$(python3 -c "import statistics as s, yaml; d = yaml.safe_load(open('baselines/h200.yaml'))['entries']
print(' '.join(k for k, e in d.items() if s.median(e['run_medians_ms']) < 0.05))")
    echo "$(echo "$IDS" | wc -w) short cases"
    for g in 0 1; do
      ( export CUDA_VISIBLE_DEVICES=$g TMPDIR="/tmp/gpu$g"; W="noise-work-p$g${TAG:-}"
        rm -rf "$TMPDIR"; mkdir -p "$W" "$TMPDIR"
        cp baselines/h200.yaml "$W/"
        # shellcheck disable=SC2086  # IDS: one node id a word
        timeout -s INT "$BUDGET" python3 -m noise_benchmark.benchmark --workdir "$W" --stages steady --runs 8 \
          --time-limit $(( BUDGET - 15 )) -- $IDS --hw=h200 --attnperf-tolerance=1.5% \
          --attnperf-processes="${PROCESSES:-3}" > "$OUT/g$g.log" 2>&1
        tar czf "$OUT/$W.tgz" "$W" $(ls "$TMPDIR"/attnperf-workers-*/*.log 2>/dev/null) 2>/dev/null ) &
    done
    wait
    for g in 0 1; do echo "== g$g"; grep -v "^test_\|^suites" "$OUT/g$g.log" | tail -n 25; done ;;
  full)  # the whole GPU suite split over both GPUs of an x2, each case always on the same GPU
    # (GPU0: test_linear.py less its naive forward-backward GLA and LA cases, about 195 s a run
    # with workers; GPU1: test_softmax.py and those, about 190 s), steady runs against the
    # committed file at the default settings (--attnperf-processes=3), as many as fit in BUDGET
    # (default 540 s); STAGES=steady,compare adds the do_bench comparison (hot mode) after them;
    # STAGES=inject INJECT=0.02,0.05 (default 0.02,0.05,0.10) injects against the committed file
    # (an injected run takes longer than a steady one: every flagged case is measured twice).
    # A work folder keeps its baseline file between calls (the folders stay on a machine kept
    # warm; keep TAG the same); a new one starts with the committed file. FRESH=1 removes the
    # folder's file first, for STAGES=record (RECORDS=, default 3) on this machine: later calls
    # without FRESH then record more or inject against those recordings.
    # Run i of GPU0 and run i of GPU1 together are one full run. Each GPU's work folder
    # (noise-work-f<gpu>$TAG, with any worker logs kept: each GPU's job has its own TMPDIR, so a
    # job finishing first does not take the other's running workers' logs) travels back as a .tgz
    BUDGET="${BUDGET:-540}"
    MOVED="naive and fwdbwd and (gla or linear_attn)"
    for g in 0 1; do
      if [ "$g" = 0 ]; then SEL=(suites/test_linear.py -k "not ($MOVED)")
      else SEL=(suites/test_softmax.py suites/test_linear.py -k "test_softmax or ($MOVED)"); fi
      ( export CUDA_VISIBLE_DEVICES=$g TMPDIR="/tmp/gpu$g"; W="noise-work-f$g${TAG:-}"
        rm -rf "$TMPDIR"; mkdir -p "$W" "$TMPDIR"  # this call's worker logs only
        if [ "${FRESH:-0}" = 1 ]; then rm -f "$W/h200.yaml"
        elif [ ! -e "$W/h200.yaml" ]; then cp baselines/h200.yaml "$W/"; fi
        timeout -s INT "$BUDGET" python3 -m noise_benchmark.benchmark --workdir "$W" --stages "${STAGES:-steady}" \
          --runs "${RUNS:-8}" --records "${RECORDS:-3}" --inject "${INJECT:-0.02,0.05,0.10}" --time-limit $(( BUDGET - 15 )) \
          -- "${SEL[@]}" --hw=h200 --attnperf-tolerance=1.5% \
          > "$OUT/f$g.log" 2>&1
        tar czf "$OUT/$W.tgz" "$W" $(ls "$TMPDIR"/attnperf-workers-*/*.log 2>/dev/null) 2>/dev/null ) &
    done
    wait
    keep_cache >/dev/null
    for g in 0 1; do echo "== f$g"; grep -v "^test_\|^suites" "$OUT/f$g.log" | tail -n "${TAIL:-25}"; done ;;
  pool-split)  # do the pool runs of --attnperf-processes time short cases as the main process does?
    # The B=1 decode cases (one recurrent step of each linear family, fla's and PyTorch's; SDPA over
    # a 1K cache) recorded in one process into a scratch copy of baselines/$HW.yaml, then gated
    # pooled over 3 processes; the table gives each process's median, the main one first (logs and
    # JSON in $OUT/pool-split.tgz)
    SCRATCH=$(mktemp -d) LOGS=$(mktemp -d)
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
    P=("${PYTEST[@]}" --hw="$HW" --attnperf-baselines="$SCRATCH")
    "${P[@]}" "${IDS[@]}" --update-baselines --attnperf-processes=1 > "$LOGS/record.log" 2>&1
    echo "recorded in one process: $(tail -n 1 "$LOGS/record.log")"
    "${P[@]}" "${IDS[@]}" --attnperf-processes=3 --benchmark-json="$LOGS/pooled.json" > "$LOGS/pooled.log" 2>&1
    echo "gated over 3 processes: $(tail -n 1 "$LOGS/pooled.log")"
    python3 - "$LOGS/pooled.json" <<'PY'
import json, sys
print(f"{'case':<58} {'main':>6} {'pool 1':>7} {'pool 2':>7}  us")
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    medians = b["extra_info"].get("attnperf_process_medians_ms") or []
    case = b["fullname"].split("[", 1)[1].rstrip("]").replace("-bf16", "").replace("-fwd", "")
    print(f"{case:<58} " + " ".join(f"{1e3 * m:>7.2f}" for m in medians))
PY
    (cd "$LOGS" && tar czf "$OUT/pool-split.tgz" .) ;;
  history)  # five gating runs of eleven softmax cases (85 us to 0.75 ms) against the committed file
    # into one run history, then two with 2% extra work injected into the cases noise/inject.py
    # picks by node id (seven of the eleven) and --attnperf-fail-on-drift, then attnperf-history with
    # plots; the last table (tools/history_check.py) says whether each case shifted as expected.
    # The change-point library (ruptures, scipy) comes as wheels from .whl-history/ (carry it:
    # git-ignored). K overrides the cases; RUNS steady runs (default 5), INJECTED runs (default 2)
    if compgen -G ".whl-history/*.whl" >/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl-history/*.whl || exit 1
      export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    H="$OUT/history"; rm -rf "$H" "$OUT/inject.jsonl"; mkdir -p "$H"
    SEL="${K:-fwdbwd and causal and (b2-h12-kv3-t1024 or b2-h16-kv2-t1024 or b32-h8-t1024) and not math and not naive and not efficient}"
    STEADY="${RUNS:-5}"
    for i in $(seq 1 $(( STEADY + ${INJECTED:-2} ))); do
      more=()
      if [ "$i" -gt "$STEADY" ]; then
        more=(-p noise_benchmark.inject --attnperf-fail-on-drift --attnperf-pr-comment="$OUT/pr-run$i.md")
        export ATTNPERF_INJECT=0.02 ATTNPERF_INJECT_LOG="$OUT/inject.jsonl"
      fi
      timeout -s INT "${RUN_BUDGET:-65}" "${PYTEST[@]}" suites/test_softmax.py --hw=h200 -k "$SEL" --benchmark-disable \
        --attnperf-history="$H" --attnperf-commit="run$i" "${more[@]}" > "$OUT/history-run$i.log" 2>&1
      echo "run $i: $(tail -n 1 "$OUT/history-run$i.log")"
    done
    unset ATTNPERF_INJECT ATTNPERF_INJECT_LOG
    python3 -m pytest_attnperf.report.drifts "$H" --plot "$OUT/plots" --out "$OUT/drift.md" > /dev/null
    cat "$OUT/drift.md"
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python3 tools/history_check.py "$H/h200.jsonl" --inject-log "$OUT/inject.jsonl" --first-injected $(( STEADY + 1 )) \
      | tee "$OUT/history-check.md"
    (cd "$OUT" && tar czf history-runs.tgz history plots history-run*.log pr-run*.md inject.jsonl 2>/dev/null \
      && rm -rf history plots history-run*.log pr-run*.md) ;;
  check)  # check-only runs of the GPU tables, one per seed of SEEDS (default 0), each with the
    # kernel zoos of tests/zoo registered (ZOO=0 leaves them out); K selects as -k does. Each
    # seed's JUnit report goes to $OUT/check-<seed>.xml, then one table of every kernel's counts
    # and worst passing ratio (tools/power.py --junit). WORKERS=N runs N pytest-xdist workers on the
    # one GPU (a check-only run times nothing, so they may share it); EXTRA="--attnperf-opt-in=precision"
    # adds the opt-in rows
    ZOOS=(); [ "${ZOO:-1}" = 1 ] && ZOOS=(-p zoo.softmax -p zoo.linear) && export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/tests"
    # With EXTRA holding --attnperf-triton-cache=off the workers share TRITON_CACHE_DIR: the recorded
    # choices are installed there first, so a kernel with a recorded choice autotunes in none of them
    case " ${EXTRA:-} " in *" --attnperf-triton-cache=off "*)
      python3 -c "import sys; from pathlib import Path; from pytest_attnperf.store.autotune import install
got, problems = install(Path('baselines/h200.autotune'), Path(sys.argv[1]))
print(f'{len(got)} recorded autotune choices installed into {sys.argv[1]}', *problems, sep=chr(10))" "$TRITON_CACHE_DIR" ;;
    esac
    for seed in ${SEEDS:-0}; do
      # shellcheck disable=SC2086  # EXTRA: more pytest arguments, split on spaces
      timeout -s INT "${BUDGET:-540}" "${PYTEST[@]}" suites/ --hw=h200 --attnperf-check-only --attnperf-seed="$seed" \
        ${EXTRA:-} ${WORKERS:+-n "$WORKERS"} "${ZOOS[@]}" ${K:+-k "$K"} --junitxml="$OUT/check-$seed.xml" > "$OUT/check-$seed.log" 2>&1
      tail -n 3 "$OUT/check-$seed.log"
    done
    python3 tools/power.py --junit "$OUT"/check-*.xml ${ZOOS:+--zoo zoo.softmax --zoo zoo.linear} \
      > "$OUT/check-table.md" 2>&1; grep -c . "$OUT/check-table.md" ;;
  power)  # the correctness rule's power on this GPU (tools/power.py --device cuda: references and
    # yardsticks only, no kernel): CASES, a regular expression over the GPU table's case ids, opt-in
    # rows included (default the precision rows), FAMILIES (comma-separated, default all); the table
    # in $OUT/power.log, the rows in $OUT/power.jsonl
    # shellcheck disable=SC2086  # FAMILIES: one argument or none
    python3 tools/power.py --table gpu --device cuda ${FAMILIES:+--families "$FAMILIES"} \
      --cases "${CASES:-b2-h8-(hk4-)?t1024-d64-fp(16|32)}" --out "$OUT/power.jsonl" > "$OUT/power.log" 2>&1
    grep "^|" "$OUT/power.log" | tail -n 60 ;;
  integrity)  # the timing-integrity zoo (tests/zoo/integrity.py) through the softmax suite, timed,
    # on the cases K selects (default three: GQA bf16, causal bf16, fp16); every integrity-bad-*
    # case should fail ("the timed computation differs from the checked one") and every
    # integrity-ok-* pass. JUnit to $OUT/integrity.xml, then the counts
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/tests"
    timeout -s INT "${BUDGET:-240}" "${PYTEST[@]}" -rfs suites/test_softmax.py --hw=h200 -p zoo.integrity \
      -k "integrity and (${K:-b2-h12-kv3-t1024 or b1-h12-t512 or b2-h8-t512-d64-fp16})" \
      --junitxml="$OUT/integrity.xml" > "$OUT/integrity.log" 2>&1
    echo "bad failed: $(grep -c '^FAILED.*integrity-bad' "$OUT/integrity.log"), ok failed: $(grep -c '^FAILED.*integrity-ok' "$OUT/integrity.log")"
    tail -n 1 "$OUT/integrity.log" ;;
  inventory)  # the kernel inventory (tools/device/inventory.py): what torch.profiler sees of a graph replay,
    # a few softmax and linear cases recorded into $OUT/inventory/baselines (not the committed file)
    # with their kernels and profiling time, then gated with two of them changed (SDPA's own dispatch
    # run as efficient, an extra copy in fla's chunk GLA); about 2 minutes
    timeout -s INT "${BUDGET:-300}" python3 tools/device/inventory.py 2>&1 | tee "$OUT/inventory.log" | tail -n 20
    keep_cache >/dev/null ;;
  memory)  # the memory gate on the softmax suite's GPU cases K selects (default three whose scores
    # outweigh the bound: B=32 H=16 T=1024, B=1 H=12 T=2048, GQA B=2 H=12/3 T=1024), gated against
    # the committed baselines: every built-in tiled kernel must stay within its bound (naive and
    # sdpa-math are exempt, their bound shown in brackets) and memory-bad-dense-scores (tests/zoo/memory.py:
    # naive's scores, registered as tiled) must fail "over the memory bound". JUnit to
    # $OUT/memory.xml; the table (kernel, case, peak above inputs, bound, verdict) to $OUT/memory.md.
    # Times are sampled briefly and gated loosely (50%): memory is what this mode checks
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/tests"
    timeout -s INT "${BUDGET:-220}" "${PYTEST[@]}" -rf suites/test_softmax.py --hw=h200 -p zoo.memory \
      --attnperf-budget=0.2s --attnperf-processes=1 --attnperf-cold-graphs=2 --attnperf-tolerance=50% \
      --benchmark-disable \
      -k "${K:-b32-h16-t1024 or b1-h12-t2048-d64-causal or b2-h12-kv3-t1024}" \
      --junitxml="$OUT/memory.xml" > "$OUT/memory.log" 2>&1
    tail -n 2 "$OUT/memory.log"
    echo "over the memory bound: $(grep -c '^FAILED.*over the memory bound' "$OUT/memory.log") (memory-bad:" \
      "$(grep -c '^FAILED.*memory-bad.*over the memory bound' "$OUT/memory.log")), memory regressed:" \
      "$(grep -c '^FAILED.*memory regressed' "$OUT/memory.log")"
    python3 tools/memory.py junit "$OUT/memory.xml" --table-out "$OUT/memory.md" ;;
  memory-noise)  # the spread of the peak above the inputs (CudaTimer._peak_mib, what a run records)
    # of the built-in softmax kernels on three GPU cases (CASES, comma-separated ids), REPEATS (20)
    # calls each after warm-up, in two processes; both JSON files and the table to $OUT
    for run in 1 2; do
      timeout -s INT "${BUDGET:-110}" python3 tools/memory.py noise --repeats "${REPEATS:-20}" \
        ${CASES:+--cases "$CASES"} --out "$OUT/memory-noise-$run.json" > "$OUT/memory-noise-$run.log" 2>&1
      tail -n 1 "$OUT/memory-noise-$run.log"
    done
    python3 tools/memory.py noise-table "$OUT"/memory-noise-[12].json --table-out "$OUT/memory-noise.md" ;;
  models)  # the committed model configs at TP 1 and 8, prefill at T=4096 and 16384 (fwd and fwd+bwd)
    # and decode (one token, B=1 over 32K keys and B=32 over 8K), the kernels K selects (default:
    # cuDNN, flash, flex-window, fla's chunk GDN and its fused recurrent step; K=all: every kernel), recorded with
    # --update-baselines into a copy of baselines/ ($OUT/baselines, the file to commit from, packed as $OUT/baselines.tgz), stopped
    # at BUDGET (default 330 s, counted from the mode's start; fla autotunes the GDN heads on a fresh
    # machine); the table last, the report's model tables in $OUT/models-report.tgz. MISSING=1 and
    # RESUME=1 as for record-linear
    t0=$SECONDS
    BASE="$OUT/baselines"; rm -rf "$BASE"; cp -r baselines "$BASE"
    resume_restore "$BASE"
    OPTS=("${MODEL_OPTS[@]}" --attnperf-baselines="$BASE")
    SEL=(pytest_attnperf/families/models/suite.py)  # K=all: every kernel
    [ "${K:-}" = all ] || SEL+=(-k "${K:-sdpa-cudnn or sdpa-flash or flex-window or fla-chunk or fla-fused-recurrent}")
    if [ -n "${MISSING:-}" ]; then
      ids=$(missing_ids "$BASE/$HW.yaml" "${SEL[@]}" "${OPTS[@]}") || exit 1
      mapfile -t SEL < <(printf '%s\n' "$ids" | grep .)
      echo "${#SEL[@]} selected cases without an entry"
    fi
    # stopped at BUDGET (record_for), then its journal is merged
    [ "${#SEL[@]}" -gt 0 ] && record_for "$(left_of "${BUDGET:-330}" "$t0")" "$OUT/models.log" "${SEL[@]}" \
      "${OPTS[@]}" --benchmark-disable --attnperf-case-timeout=150 --attnperf-report="$OUT/models-report"
    "${PYTEST[@]}" pytest_attnperf/families/models/suite.py "${OPTS[@]}" --update-baselines --collect-only 2>&1 \
      | grep "^baselines:" | tee "$OUT/models-merge.log"
    resume_save "$BASE"
    grep -E "passed|failed|skipped" "$OUT/models.log" | tail -n 1
    grep -E "^SKIPPED|^FAILED" "$OUT/models.log" | cut -c1-160 | sort | uniq -c | head -n 20
    keep_cache >/dev/null
    python3 - "$BASE/$HW.yaml" <<'PY'
import sys, yaml
entries = yaml.safe_load(open(sys.argv[1]))["entries"]
rows = [(k.split("[", 1)[1].rstrip("]"), e) for k, e in sorted(entries.items()) if "families/models/" in k]
print(f"{len(rows)} model entries in {sys.argv[1]}")
print(f"{'case-kernel-direction':<72} {'median_ms':>10} {'tflops':>8} {'gb_per_s':>9}")
for name, e in rows:
    print(f"{name:<72} {e['median_ms']:>10.4g} {e.get('tflops') or 0:>8.1f} {e.get('gb_per_s') or 0:>9.0f}")
PY
    # the recorded file and its autotune choices (one file each) as one archive
    (cd "$OUT" && tar czf baselines.tgz baselines && rm -rf baselines)
    # the report, its model tables among them (report.md)
    if [ -d "$OUT/models-report" ]; then (cd "$OUT" && tar czf models-report.tgz models-report && rm -rf models-report); fi ;;
  models-gate)  # the model cases against the committed baselines (no recording): the configs and
    # degrees of the models mode, every kernel (K: a -k selection), a case without an entry failed
    # (--attnperf-require-baseline), stopped at BUDGET (default 300 s); every test's time in
    # $OUT/models-gate.xml. K=all, as in the models mode, selects every kernel too
    [ "${K:-}" = all ] && K=
    timeout -s INT "${BUDGET:-300}" "${PYTEST[@]}" pytest_attnperf/families/models/suite.py "${MODEL_OPTS[@]}" \
      --junitxml="$OUT/models-gate.xml" -o junit_duration_report=total \
      --benchmark-disable --attnperf-case-timeout=150 --attnperf-report="$OUT/models-gate-report" \
      --attnperf-require-baseline ${K:+-k "$K"} 2>&1 | tee "$OUT/models-gate.log"
    if [ -d "$OUT/models-gate-report" ]; then
      (cd "$OUT" && tar czf models-gate-report.tgz models-gate-report && rm -rf models-gate-report)
    fi
    keep_cache >/dev/null ;;
  decode)  # the decode suite's GPU tables (suites/test_decode.py) recorded into a temporary copy of
    # baselines/ (the committed files untouched; the recorded file comes back as
    # $OUT/decode-h200.yaml, and with its autotune choices as $OUT/decode-baselines.tgz), with the
    # report's decode table (report.md in $OUT/decode-report.tgz); floors
    # suggested at 70% of each case's measured bandwidth (roofline) fraction (tools/decode_floors.py:
    # $OUT/decode-floors.json, and BUILTIN lines in $OUT/decode-floors.txt); then a gate run against
    # that recording of sdpa-flash with those floors and of the decode zoo (tests/zoo/decode.py):
    # reads-twice, held to sdpa-flash's floors, must fail them; upper-left must fail its check
    TMPB=$(mktemp -d); cp baselines/*.yaml "$TMPB/" 2>/dev/null
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/tests:$PWD/tools"
    start=$(date +%s)
    timeout -s INT "${BUDGET:-300}" "${PYTEST[@]}" suites/test_decode.py --hw=h200 --update-baselines \
      --attnperf-baselines="$TMPB" --attnperf-report="$OUT/decode-report" --benchmark-disable ${K:+-k "$K"} \
      > "$OUT/decode-record.log" 2>&1
    echo "decode suite: $(( $(date +%s) - start )) s; $(tail -n 1 "$OUT/decode-record.log")"
    cp "$TMPB/h200.yaml" "$OUT/decode-h200.yaml" 2>/dev/null
    python3 tools/decode_floors.py suggest "$OUT/decode-report/report.json" --out "$OUT/decode-floors.json" \
      --hold zoo-bad-decode-reads-twice=sdpa-flash > "$OUT/decode-floors.txt" 2>&1
    ATTNPERF_DECODE_FLOORS="$OUT/decode-floors.json" timeout -s INT "${GATE_BUDGET:-100}" "${PYTEST[@]}" -rfs \
      suites/test_decode.py --hw=h200 --attnperf-baselines="$TMPB" -p zoo.decode -p decode_floors --benchmark-disable \
      -k "test_softmax_decode and (sdpa-flash or zoo-)" --junitxml="$OUT/decode-gate.xml" > "$OUT/decode-gate.log" 2>&1
    echo "gate: $(tail -n 1 "$OUT/decode-gate.log")"
    G="$OUT/decode-gate.log"
    echo "below floor: sdpa-flash $(grep -c 'sdpa-flash-fwd\]: BELOW FLOOR' "$G"), reads-twice" \
      "$(grep -c 'reads-twice-fwd\]: BELOW FLOOR' "$G") (of $(grep -c '"sdpa-flash"' "$OUT/decode-floors.txt") sdpa-flash floors);" \
      "FAILED: upper-left $(grep -c '^FAILED.*upper-left' "$G"), split-kv $(grep -c '^FAILED.*split-kv' "$G")"
    keep_cache >/dev/null; cat "$OUT/decode-floors.txt"
    # the recording with its autotune choices, and the report, as archives
    tar czf "$OUT/decode-baselines.tgz" -C "$TMPB" . && (cd "$OUT" && tar czf decode-report.tgz decode-report \
      && rm -rf decode-report) ;;
  catalogue)  # the correctness catalogue over every built-in kernel, check-only, each tier of TIERS (default
    # smoke,full) with WORKERS pytest-xdist workers (default 4) sharing the one GPU (families.share: a
    # large row takes it alone); fla's autotuned
    # kernels held to their first configuration (the catalogue checks numbers, and each new head shape
    # would autotune for minutes); each tier stopped by SIGINT after BUDGET s (default 270), its summary
    # still written. Per tier: the JUnit report, the coverage JSON and the log in $OUT,
    # the wall time and the per-kernel coverage lines last
    mkdir -p /tmp/hold && printf '%s\n' "from pytest_attnperf.families.interpret import hold_autotuners" \
      "hold_autotuners()" > /tmp/hold/sitecustomize.py  # in every worker process too
    for tier in ${TIERS:-smoke full}; do
      start=$SECONDS
      PYTHONPATH="/tmp/hold:$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout -s INT "${BUDGET:-270}" \
        python3 -m pytest -p no:cacheprovider -q --tb=line \
        -n "${WORKERS:-4}" suites/test_catalogue.py --attnperf-catalogue="$tier" --benchmark-disable \
        --attnperf-coverage-json="$OUT/coverage-$tier.json" --junitxml="$OUT/catalogue-$tier.xml" \
        > "$OUT/catalogue-$tier.log" 2>&1
      echo "tier $tier: exit $?, $((SECONDS - start)) s on one GPU, $(tail -n 1 "$OUT/catalogue-$tier.log")"
    done
    for tier in ${TIERS:-smoke full}; do
      echo "== $tier"; grep -E '^(FAILED|XPASS|  [a-z_]+/)' "$OUT/catalogue-$tier.log" | cut -c1-400
    done
    # the findings on fla's kernels, outside the harness (tools/fla_findings.py), autotuned as fla ships
    [ "${FINDINGS:-1}" = 1 ] && timeout 300 python3 tools/fla_findings.py 2>&1 | tee "$OUT/fla-findings.txt" | tail -n 12 ;;
  *) echo "usage: $0 record-linear|gate|noise|pair|short|full|check|power|integrity|inventory|memory|memory-noise|models|decode|history" >&2; exit 2 ;;
esac
