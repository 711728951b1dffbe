"""The package describes itself, not its history: no dates, machine names or result folders in its
code, docstrings or report template. What a number rests on is cited as a docs/ or benchmarks/ page
(benchmarks/NOTES.md, docs/results.md#section), and a machine is named by its kind ("a datacenter
GPU", "a 2-core CPU without AMX")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ("autoao", "kernels", "search_space", "evaluators", "reports")  # the autoao namespace's folders
SUFFIXES = (".py", ".j2")  # code and templates; data such as evaluators/tasks/*.jsonl is task text
# A date, a product line, or a result folder. Case-sensitive: a docs/ page's heading anchor is
# lowercase, and the heading may name the machine the page's numbers came from.
HISTORY = re.compile(r"20\d{2}-\d{2}-\d{2}|H100|H200|EPYC|Xeon|benchmarks/results|results/20\d{2}")


def package_files(root: Path) -> list[Path]:
    """Every .py and .j2 file under the package's folders of `root`."""
    return sorted(p for folder in PACKAGE for p in (root / folder).rglob("*")
                  if p.is_file() and p.name.endswith(SUFFIXES))


def history_lines(files: list[Path], root: Path) -> list[str]:
    """'file:line: text' for each line of `files` that names a date, a machine or a result folder."""
    found = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return found


def test_package_names_no_dates_machines_or_result_folders():
    files = package_files(ROOT)
    assert ROOT / "reports" / "template.html.j2" in files and ROOT / "autoao" / "api.py" in files
    found = history_lines(files, ROOT)
    assert not found, ("say what the code does, in the present tense, and cite the page the number is on "
                       "(docs/results.md#section, benchmarks/NOTES.md):\n" + "\n".join(found))


def test_the_check_can_fail(tmp_path):
    bad = ["measured 2026-12-03", "on the H100", "on the H200", "a 2-core EPYC", "an AMX Xeon",
           "see benchmarks/results/cpu/x/", "(results/2026-12-04-h200/prefill/)"]
    good = ["on a datacenter GPU (sm_90, Hopper)", "a 2-core CPU without AMX: benchmarks/NOTES.md",
            "docs/results.md#cpu-smollm2-135m-the-demo-on-a-2-core-amd-epyc"]
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text("\n".join(good + bad) + "\n")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "t.html.j2").write_text("<p>on the H200</p>\n")
    (tmp_path / "evaluators" / "tasks").mkdir(parents=True)
    (tmp_path / "evaluators" / "tasks" / "t.jsonl").write_text('{"text": "on 2026-12-03"}\n')  # data: not scanned

    found = history_lines(package_files(tmp_path), tmp_path)

    k = Path("kernels", "k.py")
    assert found == [f"{k}:{len(good) + i}: {line}" for i, line in enumerate(bad, 1)] + \
        [f"{Path('reports', 't.html.j2')}:1: <p>on the H200</p>"]
