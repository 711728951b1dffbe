"""Packaging: the one-namespace layout, package data, and a light `import autoao`."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_autoao_stays_light():
    """lm-eval, triton, matplotlib, jinja2, optuna, pandas and transformers load only when used."""
    code = ("import sys, autoao, autoao.search_space, autoao.kernels, autoao.plan; "
            "heavy = [m for m in ('lm_eval', 'triton', 'matplotlib', 'jinja2', 'optuna', 'pandas', 'transformers') "
            "if m in sys.modules]; print(heavy); assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_wheel_maps_top_level_folders_into_one_namespace(tmp_path):
    """`pip install .` ships search_space/, kernels/, ... as autoao.search_space, autoao.kernels, ...
    with the bundled task data, and nothing as a bare top-level `kernels` package."""
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheel = next(tmp_path.glob("autoao-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in ["autoao/__init__.py", "autoao/kernels/int4.py", "autoao/search_space/int4.py",
                     "autoao/evaluators/timing.py", "autoao/evaluators/tasks/autoao_facts.yaml",
                     "autoao/evaluators/tasks/autoao_facts.jsonl", "autoao/evaluators/tasks/autoao_text.jsonl",
                     "autoao/reports/__init__.py", "autoao/reports/template.html.j2"]:
        assert expected in names, expected
    assert not any(n.startswith(("kernels/", "search_space/", "evaluators/", "reports/")) for n in names)
