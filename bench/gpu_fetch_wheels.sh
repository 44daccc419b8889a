#!/usr/bin/env bash
# Download the wheels of bench/gpu_wheels.txt for the GPU machine (Python 3.12, manylinux x86_64)
# into .whl/gpu/ (git-ignored; carry it to the device with the working tree).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl/gpu}
mkdir -p "$dest"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dest" -r bench/gpu_wheels.txt
du -sh "$dest"
