#!/usr/bin/env bash
# Download, into .whl/ (ignored by git), the wheels the lent GPU machine lacks for solbench's real path:
# diffusers, pydantic (+ pydantic-core, annotated-types, typing-inspection, typing-extensions), and the
# versions of transformers, peft and regex this checkout is tested with. The GPU image has CUDA torch,
# huggingface_hub, tokenizers, safetensors, accelerate, tensorboard, pandas, pyarrow, rich and pyyaml
# (/work/.library/device/KINDS.md). Pure-Python or manylinux wheels for CPython 3.12, no dependencies
# resolved: scripts/gpu_measure.sh installs them with --no-deps --target. About 22 MB.
#
#   bash scripts/fetch_gpu_wheels.sh            # versions taken from .venv (the tested ones)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
packages=(diffusers transformers peft regex pydantic pydantic-core annotated-types typing-inspection typing-extensions)
pins=()
for name in "${packages[@]}"; do
  pins+=("$name==$("$PYTHON" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
done
mkdir -p .whl
rm -f .whl/*.whl
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pins[@]}"
ls -la .whl
du -sh .whl
