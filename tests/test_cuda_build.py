"""Building the CUDA kernels on first use (kernels/cuda_build.py), with a stand-in nvcc: one build
per source and flags, cached on disk; a failed build names the command and nvcc's message and
leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autoao.kernels import cuda_build

FAKE_NVCC = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/calls"
if grep -q BROKEN "$(eval echo \\${$#})"; then echo "error: BROKEN is not a type" >&2; exit 2; fi
while [ $# -gt 1 ]; do if [ "$1" = "-o" ]; then echo library > "$2"; fi; shift; done
"""


@pytest.fixture
def nvcc(tmp_path, monkeypatch) -> Path:
    """A stand-in nvcc on PATH that records its calls and writes a library file (or fails on a
    source containing BROKEN); the cache under tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvcc"
    exe.write_text(FAKE_NVCC)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path / "cache"))
    return bin_dir / "calls"


def test_a_library_is_built_once_per_source_and_flags(nvcc, tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k() {}\n")
    first = cuda_build.build(src, ["-DX=1"], "k", "90", "the test kernel", "skip it")
    assert first.read_text() == "library\n" and first.name.startswith("k_sm90_")
    assert cuda_build.build(src, ["-DX=1"], "k", "90", "the test kernel", "skip it") == first
    assert len(nvcc.read_text().splitlines()) == 1  # cached: nvcc ran once
    other = cuda_build.build(src, ["-DX=2"], "k", "90", "the test kernel", "skip it")
    src.write_text("__global__ void k2() {}\n")
    edited = cuda_build.build(src, ["-DX=1"], "k", "90", "the test kernel", "skip it")
    assert len({first, other, edited}) == 3 and len(nvcc.read_text().splitlines()) == 3
    assert "-gencode=arch=compute_90,code=sm_90" in nvcc.read_text()


def test_a_failed_build_names_the_command_and_nvccs_message(nvcc, tmp_path):
    src = tmp_path / "bad.cu"
    src.write_text("BROKEN x;\n")
    with pytest.raises(RuntimeError, match=r"building the test kernel failed \(.*nvcc.*bad\.cu\):\n.*BROKEN is not a type"):
        cuda_build.build(src, [], "bad", "90", "the test kernel", "skip it")
    assert list((tmp_path / "cache" / "cuda").iterdir()) == []  # no library, no temporary file left


def test_missing_nvcc_names_the_places_looked_and_the_alternative(monkeypatch, tmp_path):
    monkeypatch.setattr(cuda_build.shutil, "which", lambda name: None)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(cuda_build, "TOOLKIT_DEFAULT", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"the test kernel needs nvcc.*\$CUDA_HOME.*or skip it\."):
        cuda_build.nvcc("the test kernel", "skip it")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    assert cuda_build.nvcc("the test kernel", "skip it") == str(tmp_path / "bin" / "nvcc")
