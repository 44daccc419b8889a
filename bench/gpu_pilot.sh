#!/usr/bin/env bash
# The pilot stage on a GPU (no vLLM there): a ~100 M-parameter random Llama target made by the model
# stage, N synth-format rows of random tokens (in shuffled completion order, with metadata.idx as
# speculators writes them), then `eaglelab.stages.pilot --device cuda`; prints its step lines and
# summary, the per-step seconds from its manifest. Acceptance of a random target means nothing here:
# this measures the CUDA path and its time.
#   OUT=dir bench/gpu_pilot.sh [SAMPLES] [EPOCHS]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-256}; EPOCHS=${2:-2}; W=${WORK:-/tmp/gpu_pilot}; OUT=${OUT:-$W/out}
WHEELS=${WHEELS:-.whl/gpu}; SITE=${GPU_SITE:-$PWD/.gpu_site}; PY=${PYTHON:-python3}
export PYTHONPATH="$SITE:$PWD/py${PYTHONPATH:+:$PYTHONPATH}" COLUMNS=1000
"$PY" -c "import speculators, click, pydantic, datasets" 2>/dev/null \
  || "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
mkdir -p "$W" "$OUT"
"$PY" -m eaglelab.stages.tiny_model --out "$W/model" --hidden 1024 --layers 8 --heads 16 --kv-heads 4 \
  --intermediate 2816 --max-shard-size 200MB > "$OUT/model.log" 2>&1
"$PY" - "$W/synth" "$N" <<'PYEOF'
import json, random, sys
from pathlib import Path
out, n = Path(sys.argv[1]), int(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
rng = random.Random(0)
rows = []
for i in range(n):
    length = rng.randint(256, 2048); prompt = length // 4
    rows.append({"id": f"r{i}_gen0", "primary_id": f"r{i}", "input_ids": [rng.randrange(8, 4096) for _ in range(length)],
                 "loss_mask": [0] * prompt + [1] * (length - prompt),
                 "metadata": {"idx": i, "finish_reason": "stop", "is_tool_call": False}})
rng.shuffle(rows)
(out / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
PYEOF
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
/usr/bin/time -f "pilot wall %e s, max RSS %M KB" timeout -k 30 1200 "$PY" -m eaglelab.stages.pilot \
  --synth "$W/synth" --model "$W/model" --out "$W/pilot" --samples "$N" --wait-s 10 --seq-length 4096 \
  --draft-vocab-size 1024 --epochs "$EPOCHS" --device cuda > "$OUT/pilot.log" 2>&1 || { tail -40 "$OUT/pilot.log"; exit 1; }
grep -a "^pilot\|acceptance/rate\|profile/tokens_per_s" "$OUT/pilot.log" | cut -c1-300 | tail -30
"$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print('counts', d['counts']); print('step_seconds', d['extra']['step_seconds'])" "$W/pilot/manifest.json"
cp "$W/pilot/manifest.json" "$OUT/pilot_manifest.json"
