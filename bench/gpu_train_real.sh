#!/usr/bin/env bash
# The drafter at its real size (issue 29), on a GPU machine: the train stage at Kimi-K2.5's dimensions,
# memory per phase. The wheels of bench/gpu_wheels.txt (bench/gpu_fetch_wheels.sh -> .whl/gpu) are
# installed when speculators is not importable. Figures land in $OUT (results.json, results.md, logs).
#   OUT=/tmp/out bash bench/gpu_train_real.sh --lengths 4096 8192 18432 --runs pilot full
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl/gpu}
SITE=${GPU_SITE:-/tmp/gpu_site}
PY=${PYTHON:-python3}
export OUT=${OUT:-/tmp/real_train_out} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
if ! "$PY" -c "import speculators, click, pydantic, datasets" 2>/dev/null; then
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "gpu_train_real: no wheels in $WHEELS (run bench/gpu_fetch_wheels.sh)" >&2; exit 2; }
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl || exit 2
fi
export PYTHONPATH="$SITE:$PWD/py${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import speculators, torch, transformers, triton; print('versions: torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__, 'speculators', getattr(speculators, '__version__', '0.9.0?'), 'gpu', torch.cuda.get_device_name())"
# timeout -k: a process stopped during torch.compile can hang (docs/cpu-stack.md)
exec timeout -k 20 "${REHEARSAL_TIMEOUT:-570}" "$PY" bench/gpu_train_real.py "$@"
