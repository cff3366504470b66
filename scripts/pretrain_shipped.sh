#!/usr/bin/env bash
# The shipped tiny model (solbench/assets/tiny_t2i.*: width 256, "rDmix") from nothing, in four stages on
# 2 CPU cores (docs/embedded-world.md, ninth round and "Shipping rDmix"; stage times measured on an AMD EPYC,
# about 3 h 45 min in all):
#   1. v3c      6000 steps of flow matching on fresh scenes, 8 heads x 32 (width 256), 2 threads    about 2 h
#   2. w300d10  600 steps of NVFP4 consistency against nvfp4_tiny_flux (weight 300), distilled
#               towards v3c (weight 10), 1 thread                                                 about 41 min
#   3. pairs    6144 noise-image couplings drawn by w300d10 (dpm2, 10 steps, seed 0), 1 thread    13-20 min
#   4. rDmix    700 steps, half of each batch from the couplings and half fresh scenes, NVFP4
#               consistency 30, 1 thread; its EMA weights are the shipped model                   about 47 min
#
#     bash scripts/pretrain_shipped.sh [OUT]     # OUT: the final model's folder (default build/tiny_shipped)
#
# Resumable: run the same command again after an interruption. Every pretraining stage runs with --resume, so a
# finished stage resumes at its last step and ends at once and an interrupted one continues from its last
# checkpoint in its work folder; the couplings are drawn again only when their file is missing (written under a
# temporary name and moved into place when complete). The intermediate stages go to $BUILD (default build/).
# Same seeds and thread counts give the same weights on one machine; across CPUs the float sums differ in the
# last bits, so a rebuild elsewhere matches the measured numbers, not the checksum. To ship a rebuild: copy
# OUT/tiny_t2i.{safetensors,json} and tiny_t2i_train.json into solbench/assets/, then
# `python scripts/pretrain_tiny.py --eval --out solbench/assets` writes its evaluation record.
# The sizes can be shrunk for a test of the chain (tests/test_pretrain_shipped.py): V3C_STEPS, W300_STEPS,
# PAIRS_COUNT, RDMIX_STEPS, and EXTRA (arguments added to every pretraining stage, e.g. "--batch 4").
set -euo pipefail

PYTHON=${PYTHON:-python}
BUILD=${BUILD:-build}
OUT=${1:-$BUILD/tiny_shipped}
HERE=$(cd "$(dirname "$0")" && pwd)
V3C_STEPS=${V3C_STEPS:-6000}
W300_STEPS=${W300_STEPS:-600}
PAIRS_COUNT=${PAIRS_COUNT:-6144}
RDMIX_STEPS=${RDMIX_STEPS:-700}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
COMMON=(--lr 3e-4 --warmup 50 --ema 0.995 --consistency-kind nvfp4 --consistency-recipe nvfp4_tiny_flux
        --consistency-anchor proj_out --shift 3 --threads 1 --no-eval --resume)

echo "== 1/4 v3c: width 256, flow matching on fresh scenes"
"$PYTHON" "$HERE/pretrain_tiny.py" --heads 8 --steps "$V3C_STEPS" --threads 2 --no-eval --resume "${EXTRA_ARGS[@]}" \
    --out "$BUILD/tiny_v3c" --workdir "$BUILD/pretrain_tiny_v3c"

echo "== 2/4 w300d10: NVFP4 consistency at FLUX's coverage, distilled towards v3c"
"$PYTHON" "$HERE/pretrain_tiny.py" --init-from "$BUILD/tiny_v3c" --distill-from "$BUILD/tiny_v3c" \
    --distill-weight 10 --noise-consistency 300 --steps "$W300_STEPS" "${COMMON[@]}" "${EXTRA_ARGS[@]}" \
    --out "$BUILD/tiny_v3c_w300d10" --workdir "$BUILD/pretrain_tiny_v3c_w300d10"

PAIRS="$BUILD/pairs_w300d10_u.safetensors"
if [ -f "$PAIRS" ]; then
    echo "== 3/4 pairs: $PAIRS is there, kept"
else
    echo "== 3/4 pairs: $PAIRS_COUNT couplings of w300d10"
    "$PYTHON" "$HERE/reflow_pairs.py" --model-path "$BUILD/tiny_v3c_w300d10" --count "$PAIRS_COUNT" --threads 1 \
        --out "$PAIRS.partial.safetensors"
    mv "$PAIRS.partial.safetensors" "$PAIRS"
fi

echo "== 4/4 rDmix: mixed reflow stage -> $OUT"
"$PYTHON" "$HERE/pretrain_tiny.py" --init-from "$BUILD/tiny_v3c_w300d10" --reflow-pairs "$PAIRS" \
    --reflow-fraction 0.5 --steps "$RDMIX_STEPS" --noise-consistency 30 "${COMMON[@]}" "${EXTRA_ARGS[@]}" \
    --out "$OUT" --workdir "$BUILD/pretrain_tiny_rDmix"
echo "done: $OUT"
