#!/usr/bin/env bash
# The stages that need no vLLM, on a GPU: transformers-backend extraction (batch 1 and 8) and a few
# speculators training steps on CUDA, through the stage scripts; prints tokens/s.
#   bench/gpu_stages.sh [--samples N] [--train-steps N] [--attn sdpa|simple_flex_attention]
# Needs: python3 with torch (CUDA) + transformers; the wheels of bench/gpu_wheels.txt in
# $WHEELS (default .whl/gpu, made by bench/gpu_fetch_wheels.sh) unless speculators is importable.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl/gpu}
SITE=${GPU_SITE:-$PWD/.gpu_site}
PY=${PYTHON:-python3}
"$PY" -c "import torch, transformers; assert torch.cuda.is_available(), 'no CUDA'" \
  || { echo "gpu_stages: needs $PY with torch (CUDA) and transformers" >&2; exit 2; }
export PYTHONPATH="$SITE:$PWD/py${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import speculators, click, pydantic, datasets" 2>/dev/null; then
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "gpu_stages: no wheels in $WHEELS (run bench/gpu_fetch_wheels.sh)" >&2; exit 2; }
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
fi
"$PY" -c "import speculators, torch, transformers; print('speculators', speculators.__version__ if hasattr(speculators, '__version__') else '?', 'torch', torch.__version__, 'transformers', transformers.__version__)"
# timeout -k: a stage stopped during torch.compile can hang (cpu-stack.md)
exec timeout -k 30 1500 "$PY" bench/gpu_stages.py "$@"
