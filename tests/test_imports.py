"""The import graph runs one way, as ARCHITECTURE.md draws it: every autoao module imports only
modules of its own layer or of layers below it, and a function-level import of an autoao module
exists only to keep a heavy optional library (lm-eval, triton, matplotlib, jinja2) out of
`import autoao`, saying so in a comment on that line."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"autoao": "autoao", "search_space": "autoao.search_space", "kernels": "autoao.kernels",
           "evaluators": "autoao.evaluators", "reports": "autoao.reports"}

# DESIGN.md's order, lowest first: leaves, then the data flow profile -> candidates -> measure ->
# search -> plan -> apply -> report, its stages in the order optimize calls them. A module may
# import from its own layer and the ones before it, never after.
LAYERS = [
    ["autoao.common", "autoao.clock", "autoao.calibration", "autoao.types", "autoao.decisions",
     "autoao.upgrades", "autoao.records", "autoao.ledger"],  # leaves: the values every stage passes on, the run files, the clock
    ["autoao.kernels"],
    ["autoao.search_space"],
    ["autoao.profile", "autoao.plan"],
    ["autoao.evaluators"],
    ["autoao.cost", "autoao.budget", "autoao.models"],
    ["autoao.stages.search"],
    ["autoao.stages.inputs"],
    ["autoao.stages.judges"],
    ["autoao.stages.measure"],
    ["autoao.stages.bench"],
    ["autoao.stages.anchors", "autoao.stages.choose"],
    ["autoao.stages.anytime"],
    ["autoao.stages.finalize"],
    ["autoao.stages.outputs", "autoao.workers"],
    ["autoao.reports"],
    ["autoao.export"],
    ["autoao.options", "autoao.api"],
    ["autoao.cli", "autoao"],  # the package's __init__ re-exports the API
]
LAZY_REASON = re.compile(r"#.*\b(light|lazy|lazily|heavy|optional)\b", re.I)


@functools.cache
def _modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = path
    return out


def _rank(module: str) -> int:
    best, rank = -1, None
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank is not None, f"{module} is in no layer of tests/test_imports.py: add it"
    return rank


def _imports(path: Path, module: str) -> list[tuple[str, int, bool]]:
    """(imported autoao module, line, inside a function) for every import in the file."""
    tree = ast.parse(path.read_text())
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from autoao import search_space` imports the sub-module, not the package
            known = _modules()
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        for name in names:
            if name == "autoao" or name.startswith("autoao."):
                out.append((name, node.lineno, id(node) in in_function))
    return out


def test_every_import_of_an_autoao_module_points_down_the_layers():
    modules = _modules()
    back = []
    for module, path in modules.items():
        for target, line, _ in _imports(path, module):
            if target not in modules and target.rpartition(".")[0] in modules:
                target = target.rpartition(".")[0]  # `from autoao.x import name`
            if target.startswith(module + ".") or module == "autoao" and target == "autoao":
                continue  # a package importing its own sub-modules
            if _rank(target) > _rank(module):
                back.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {target}")
    assert not back, "imports that run back up the layers:\n" + "\n".join(back)


def test_function_level_imports_of_autoao_modules_say_they_keep_import_light():
    modules = _modules()
    unexplained = []
    for module, path in modules.items():
        lines = path.read_text().splitlines()
        for target, line, inside in _imports(path, module):
            if inside and not LAZY_REASON.search(lines[line - 1]):
                unexplained.append(f"{path.relative_to(ROOT)}:{line}: {lines[line - 1].strip()}")
    assert not unexplained, ("function-level imports of autoao modules without a comment saying which heavy "
                             "library they keep out of `import autoao`:\n" + "\n".join(unexplained))


def test_the_layering_check_catches_a_back_edge(tmp_path):
    """The check above can fail: a kernels module that imports the evaluators is a back edge."""
    assert _rank("autoao.evaluators.timing") > _rank("autoao.kernels.int4")
    path = tmp_path / "bad.py"
    path.write_text("def f():\n    from autoao.evaluators.timing import fastest\n")
    assert _imports(path, "autoao.kernels.bad") == [("autoao.evaluators.timing", 2, True)]


@pytest.mark.parametrize("heavy", ["lm_eval", "triton", "matplotlib", "jinja2"])
def test_import_autoao_stays_light(heavy):
    code = f"import sys, autoao; sys.exit(1 if {heavy!r} in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, f"`import autoao` imported {heavy}"
