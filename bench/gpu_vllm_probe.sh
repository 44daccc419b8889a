#!/bin/bash
# vLLM 0.26.0 on the device in two calls (a call carries 64 MiB; docs/foresight.md, "The output probe"),
# the second within the 30 s the machine stays warm. Made here: .whl/vA/C_stable.so.xz (vllm's
# _C_stable_libtorch.abi3.so, xz -9), .whl/vB/{vllm_py.tar.xz (its Python, no flash-attention
# libraries), wheels/ (the import-time dependencies the device lacks, speculators'), demo/ (a make demo
# clone's model, drafter and eval prompts)}.
#   stage 1: carry [".whl/vA"]: bash bench/gpu_vllm_probe.sh stage1
#   stage 2: carry [".whl/vB"]: bash bench/gpu_vllm_probe.sh stage2
set -o pipefail
SITE=/tmp/vsite
case "$1" in
  stage1)
    mkdir -p $SITE/vllm && xz -dc .whl/vA/C_stable.so.xz > $SITE/vllm/_C_stable_libtorch.abi3.so && ls -la $SITE/vllm && echo STAGE1-OK ;;
  stage2)
    test -s $SITE/vllm/_C_stable_libtorch.abi3.so || { echo "COLD: stage 1's files are gone (a fresh machine)"; exit 3; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/vB/wheels/*.whl || exit 4
    tar -xJf .whl/vB/vllm_py.tar.xz -C $SITE || exit 5
    export PYTHONPATH=$SITE PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    python3 bench/gpu_vllm_probe.py --demo .whl/vB/demo --serve-only 2>&1 | tee ${OUT:-/tmp}/log.txt ;;
  *) echo "usage: $0 stage1|stage2"; exit 2 ;;
esac
