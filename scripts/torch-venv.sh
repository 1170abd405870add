#!/usr/bin/env bash
# The outside references for tests and benchmarks (PyTorch 2.x, safetensors, numpy, transformers, peft; lizard, which
# measures function lengths for tests/house_in_order.py) from PyPI, in a virtual environment kept outside the
# clone so later runs on the same machine reuse it. Prints the interpreter's path.
set -euo pipefail
venv=${SHARDWISE_VENV:-/opt/shardwise-venv}
if ! "$venv/bin/python" -c "import torch, numpy, safetensors, transformers, peft, lizard; assert int(torch.__version__.split('.')[0]) >= 2" \
    >/dev/null 2>&1; then
  echo "creating $venv with torch, numpy and safetensors from PyPI (several GB the first time)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check torch numpy safetensors transformers peft lizard >&2
fi
echo "$venv/bin/python"
