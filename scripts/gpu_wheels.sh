#!/usr/bin/env bash
# The wheels a GPU machine without network needs to run RLFactory's core and its GPU check
# (bench/gpu.py): what its image (Python 3.12, torch 2.11, transformers 5.17, pluggy, rich,
# typer, pyyaml, numpy, tensorboard, peft ...) lacks. Downloaded here, cp312 manylinux, into
# .whl/ (git-ignored), at the versions this checkout's .venv tests, and no others. Each wheel
# is --no-deps: the list below is what our dependencies and theirs need beyond the image's
# packages (the device tool's KINDS.md lists them: attrs, cloudpickle, requests, tqdm, jinja2,
# click, python-dateutil, accelerate, safetensors ... are there).
#
#   scripts/gpu_wheels.sh            # -> .whl/*.whl, prints the total size (must stay under 64 MiB)
#
# On the GPU machine (the folder travels with the tree):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:. python3 bench/gpu.py
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_PY=${VENV_PY:-.venv/bin/python}
DEST=${DEST:-.whl}
LIMIT_MIB=64

# What the core imports that the image lacks. tensordict is pure Python and declares
# torch>=2.11 from 0.15 on, which the image's torch 2.11 meets; pydantic_core and rpds-py
# are compiled, hence the cp312 manylinux tags below.
PACKAGES=(pydantic pydantic_core annotated-types typing-inspection  # config
          tensordict pyvers                                         # the training batch
          jsonschema jsonschema-specifications referencing rpds-py  # tool-argument validation
          gguf                                                      # the embedded model's format
          cookiecutter binaryornot python-slugify text-unidecode arrow tzdata)  # rlf plugins new

if [[ ! -x $VENV_PY ]]; then
    echo "gpu_wheels: $VENV_PY not found; run 'make install' first (the wheels take its tested versions)" >&2
    exit 1
fi
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
for name in "${PACKAGES[@]}"; do
    version=$("$VENV_PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name") || {
        echo "gpu_wheels: $name is not installed in $VENV_PY; run 'make install'" >&2; exit 1; }
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$DEST" "$name==$version"
    echo "  $name==$version"
done
total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
mib=$(( (total + 1048575) / 1048576 ))
echo "gpu_wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $mib MiB in $DEST (the tree and the wheels may travel $LIMIT_MIB MiB together)"
if (( mib >= LIMIT_MIB )); then
    echo "gpu_wheels: over the $LIMIT_MIB MiB that can travel" >&2
    exit 1
fi
