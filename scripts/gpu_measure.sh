#!/usr/bin/env bash
# The true-shape GPU check, as one command on a lent H100/H200 (or any CUDA GPU), from the repository root:
#
#   bash scripts/gpu_measure.sh [SPEC] [BUDGET_S]      (defaults: experiments/flux_main.yaml, 420)
#
# 1. installs the wheels scripts/fetch_gpu_wheels.sh put in .whl/ (if any) into /tmp/site, --no-deps;
# 2. lays solbench out as installed (solbench/ with methods/ as solbench/methods, symlinks) under
#    /tmp/solbench_pkg, without pip touching torch;
# 3. scripts/gpu_check.py: the scaled-matmul explore backend against the emulated numbers at FLUX's
#    layer shapes (per-tensor and rowwise FP8), sync-free, and its speed; the GEMM table (bf16 F.linear against
#    _scaled_mm tensorwise and rowwise, with and without fast accumulation); fp32 LoRA state on a bf16 GPU model;
# 4. scripts/rollout_speed.py: one transformer forward of each rollout arm at the spec's shapes (the FP8 explore
#    copy with fast accumulation and rowwise compiled first, BF16 merged, then eager rows, plain FP8, BF16 LoRA;
#    each arm's error is its row), rollout_speed.csv;
# 5. `solbench doctor SPEC --measure --isolate --budget BUDGET_S`: one iteration per method at published shapes,
#    each method in its own process (compiled, as model.compile: auto does on CUDA);
# 6. `solbench speed SPEC --published`: Table 5 timed as the speed block does on CPU (solbench.speed: the same code
#    path, CUDA-synchronised phase timers): the spec's block (or the default one: naive BF16 scaling, Sol-RL, naive
#    FP4) at published shapes with random weights, SPEED_ROUNDS rounds (default 3) interleaved and rotated, each arm
#    built, warmed up and freed in its turn (the arms do not fit in GPU memory together); its rows in
#    $OUT/speed_block/ (speed.jsonl per arm, rounds.jsonl) and speed_block.csv. SOLBENCH_SKIP_BLOCK=1 leaves it out;
# Everything lands in $OUT (the device tool's output folder; ./gpu_measure_out when unset): gpu_check.json,
# rollout_speed.csv and .json, measure.json and measure.md (rewritten after every arm / method, so a run
# cut short keeps what it measured) and gpu_measure.log. The whole script stays under the device tool's
# 600 s per command (DEADLINE_S).
# Extra arguments for the measurement go in SOLBENCH_MEASURE_ARGS (e.g. "--tiny --methods sol_rl"), for
# step 4 in SOLBENCH_SPEED_ARGS (e.g. "--tiny"), its budget in SPEED_BUDGET_S (default 200);
# SOLBENCH_SKIP_CHECK=1 leaves step 3 out (a second measurement on the same machine), SOLBENCH_SKIP_SPEED=1 step 4,
# SOLBENCH_SKIP_MEASURE=1 step 5. Without diffusers or pydantic importable it stops at once (exit 4).
set -uo pipefail
SPEC=${1:-experiments/flux_main.yaml}
BUDGET=${2:-420}
PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT:-$PWD/gpu_measure_out}
WORK=$(mktemp -d /tmp/solbench_measure.XXXXXX)
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_measure.log"
exec > >(tee "$LOG") 2>&1
echo "gpu_measure: spec $SPEC, budget ${BUDGET}s, output $OUT_DIR, started $(date -u +%FT%TZ)"

SITE=""
WHEELS=${SOLBENCH_WHEELS:-.whl}
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" "$WHEELS"/*.whl \
    || { echo "gpu_measure: installing $WHEELS/ failed"; exit 3; }
  SITE="$WORK/site:"
else
  echo "gpu_measure: no wheels in $WHEELS/ (bash scripts/fetch_gpu_wheels.sh); using the installed packages"
fi
mkdir -p "$WORK/pkg/solbench"
for entry in solbench/*; do ln -s "$PWD/$entry" "$WORK/pkg/solbench/"; done
ln -s "$PWD/methods" "$WORK/pkg/solbench/methods"
# PYTHONSAFEPATH (Python 3.11+): `python -m solbench` must not put the repository root first on sys.path,
# where solbench/ has no methods/ subpackage; the laid-out copy in $WORK/pkg is the one to import.
export PYTHONPATH="${SITE}$WORK/pkg${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONSAFEPATH=1

# Without diffusers and pydantic every step fails on its first import: stop now, with the reason, not after
# the check and the speed script have each failed on it.
if ! "$PYTHON" -c "import diffusers, pydantic" 2>"$WORK/import.err"; then
  echo "gpu_measure: diffusers or pydantic does not import ($(tail -n 1 "$WORK/import.err")); carry the wheels:"
  echo "gpu_measure: bash scripts/fetch_gpu_wheels.sh on the session's machine, then run(..., carry=[\".whl\"])"
  exit 4
fi

DEADLINE_S=${DEADLINE_S:-585}
status=0
if [ -z "${SOLBENCH_SKIP_CHECK:-}" ]; then
  timeout 120 "$PYTHON" scripts/gpu_check.py --out "$OUT_DIR" || { echo "gpu_measure: gpu_check exit $?"; status=1; }
fi
if [ -z "${SOLBENCH_SKIP_SPEED:-}" ]; then
  SPEED_BUDGET=${SPEED_BUDGET_S:-200}
  # the budget stops starting arms; the timeout also covers one arm's compilation past it
  SPEED_LIMIT=$((SPEED_BUDGET + 150))  # and never past DEADLINE_S
  [ $((DEADLINE_S - SECONDS - 5)) -lt "$SPEED_LIMIT" ] && SPEED_LIMIT=$((DEADLINE_S - SECONDS - 5))
  [ "$SPEED_LIMIT" -lt 1 ] && SPEED_LIMIT=1
  # shellcheck disable=SC2086  # SOLBENCH_SPEED_ARGS is a list of arguments
  timeout "$SPEED_LIMIT" "$PYTHON" scripts/rollout_speed.py --spec "$SPEC" --out "$OUT_DIR" \
    --budget "$SPEED_BUDGET" ${SOLBENCH_SPEED_ARGS:-} || { echo "gpu_measure: rollout_speed exit $?"; status=1; }
fi
# --isolate: each method in its own process, so a CUDA error that ends a process ends only its method's row
LEFT=$((DEADLINE_S - SECONDS))
if [ -n "${SOLBENCH_SKIP_MEASURE:-}" ]; then
  echo "gpu_measure: measurement left out (SOLBENCH_SKIP_MEASURE)"
elif [ "$LEFT" -gt 10 ]; then  # (timeout 0 would mean no limit)
  # shellcheck disable=SC2086  # SOLBENCH_MEASURE_ARGS is a list of arguments
  timeout "$LEFT" "$PYTHON" -m solbench doctor "$SPEC" --measure --isolate --budget "$BUDGET" \
    --out "$OUT_DIR" ${SOLBENCH_MEASURE_ARGS:-} || { echo "gpu_measure: measure exit $?"; status=1; }
else
  echo "gpu_measure: no time left for the measurement (DEADLINE_S=$DEADLINE_S)"; status=1
fi
LEFT=$((DEADLINE_S - SECONDS))
if [ -n "${SOLBENCH_SKIP_BLOCK:-}" ]; then
  echo "gpu_measure: speed block left out (SOLBENCH_SKIP_BLOCK)"
elif [ "$LEFT" -gt 30 ]; then
  # shellcheck disable=SC2086  # SOLBENCH_BLOCK_ARGS is a list of arguments
  timeout "$LEFT" "$PYTHON" -m solbench speed "$SPEC" --published --no-report --rounds "${SPEED_ROUNDS:-3}" \
    --results "$WORK/speed_results" ${SOLBENCH_BLOCK_ARGS:-} || { echo "gpu_measure: speed block exit $?"; status=1; }
  if [ -d "$WORK/speed_results" ]; then
    mkdir -p "$OUT_DIR/speed_block" && cp -r "$WORK"/speed_results/*/speed/* "$OUT_DIR/speed_block/" 2>/dev/null
    "$PYTHON" -c "import sys; from solbench.speed.collect import speed_table; t = speed_table(sys.argv[1]);
t is not None and t.to_csv(sys.argv[2], index=False)" "$(ls -d "$WORK"/speed_results/* | head -n 1)" \
      "$OUT_DIR/speed_block.csv" || echo "gpu_measure: speed_block.csv not written"
  fi
else
  echo "gpu_measure: no time left for the speed block (DEADLINE_S=$DEADLINE_S)"
fi
echo "gpu_measure: done $(date -u +%FT%TZ) after ${SECONDS}s, status $status"
exit $status
