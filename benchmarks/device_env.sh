# Source this on the device machine (benchmarks/*.py via the device tool): makes `import autoao`
# work without installing (the GPU image has torch/triton/safetensors but no network), by laying
# out the package as pyproject.toml maps it: autoao/ plus its sub-packages from the top-level folders.
#   source benchmarks/device_env.sh        # from the repository root, before python3 benchmarks/<script>.py
if [[ "${1:-}" == -h || "${1:-}" == --help || "${BASH_SOURCE[0]}" == "$0" ]]; then
    echo "usage: source benchmarks/device_env.sh   (from the repository root; puts autoao on PYTHONPATH)"
    [[ "${1:-}" == -h || "${1:-}" == --help ]] && { return 0 2>/dev/null || exit 0; }
    exit 2
fi
pkg=/tmp/autoao_pkg
rm -rf "$pkg" && mkdir -p "$pkg" && cp -r autoao "$pkg/"
for d in search_space kernels evaluators reports; do ln -s "$PWD/$d" "$pkg/autoao/$d"; done
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
