"""Building autoao's CUDA C++ kernels (kernels/cuda/*.cu) on first use.

    path = build(SOURCE, ["-DAUTOAO_GROUP=128"], "int4_mma_g128", arch="90", what="the CUDA int4 kernel")

Each .cu file ships with the package and is compiled by the CUDA toolkit's nvcc (PATH, $CUDA_HOME,
$CUDA_PATH or /usr/local/cuda) for the GPU's architecture into one shared library, cached under
autoao's cache directory keyed by the source's and the flags' hash; the caller loads it with ctypes
and launches on torch's current stream (so CUDA graphs capture it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import torch

from autoao.common import cache_dir

TOOLKIT_DEFAULT = "/usr/local/cuda"


def mma_arch(device: torch.device | str | int | None, what: str) -> str:
    """The GPU's architecture as nvcc names it ("90" for sm_90); RuntimeError naming `what` on a GPU
    before sm_80, which has no bf16 mma."""
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        raise RuntimeError(f"{what} needs sm_80 or newer (bf16 mma); this GPU is sm_{major}{minor}")
    return f"{major}{minor}"


def nvcc(what: str, instead: str) -> str:
    """The nvcc executable; RuntimeError naming `what` needs it and what to use `instead`."""
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), TOOLKIT_DEFAULT):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    raise RuntimeError(f"{what} needs nvcc (the CUDA toolkit) to build on first use: none on PATH, $CUDA_HOME, "
                       f"$CUDA_PATH or /usr/local/cuda. Install the toolkit matching your driver, or {instead}.")


def build(source: Path, defines: Sequence[str], stem: str, arch: str, what: str, instead: str) -> Path:
    """The shared library of `source` compiled with `defines` for sm_`arch`, by nvcc unless already
    on disk as <cache>/cuda/<stem>_sm<arch>_<hash>.so; raises RuntimeError with nvcc's message.
    Concurrent builders (threads, processes) each write their own temporary file, renamed atomically."""
    flags = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", f"-gencode=arch=compute_{arch},code=sm_{arch}",
             *defines]
    digest = hashlib.sha256(source.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    out = cache_dir() / "cuda" / f"{stem}_sm{arch}_{digest}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        cmd = [nvcc(what, instead), *flags, "-o", tmp, str(source)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            os.unlink(tmp)
            raise RuntimeError(f"building {what} failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
        os.replace(tmp, out)
    return out
