#!/usr/bin/env bash
# The GPU rehearsal of issue #13 on one H200 (the device machine): Kimi-K2.5's architecture class
# scaled down (DeepSeek-V3 MoE with MLA, random weights), extract (transformers) -> vocab -> train ->
# offline acceptance, via bench/gpu_stages.sh. Big files stay in $WORK; the figures and logs go to
# $OUT (results.json, run.log, logs.tar.gz).
#   OUT=/tmp/out bash bench/gpu_rehearsal.sh [more gpu_stages.py args]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/rehearsal_out}
WORK=${WORK:-/tmp/rehearsal}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/nvidia-smi.csv"
export PYTHONUNBUFFERED=1
bash bench/gpu_stages.sh --out "$WORK" --arch deepseek_v3 --hidden 2048 --layers 6 --heads 16 --experts 16 \
  --samples "${SAMPLES:-400}" --batch 8 --writer-threads 2 --train-steps "${TRAIN_STEPS:-60}" --draft-vocab 2048 \
  --loss-fn ce "$@" 2>&1 | tee "$OUT/run.log"
rc=${PIPESTATUS[0]}
cp "$WORK/results.json" "$OUT/" 2>/dev/null
(cd "$WORK" && tar czf "$OUT/logs.tar.gz" ./*.log gpu_time.txt model/config.json 2>/dev/null)
exit "$rc"
