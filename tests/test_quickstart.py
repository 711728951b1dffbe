"""examples/quickstart.py runs as written, and the README shows it as it is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "quickstart.py"


def _main_source() -> str:
    """The script's `def main` block: from its line to the last indented line after it."""
    lines = SCRIPT.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("def main("))
    end = start + 1
    while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
        end += 1
    return "\n".join(lines[start:end]).rstrip()


def test_readme_shows_the_quickstart_as_it_is():
    """The README's Python example is the script's main(), character for character."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert any(_main_source() in b for b in blocks), "README.md's quickstart differs from examples/quickstart.py"


@pytest.mark.slow
def test_quickstart_runs(tmp_path):
    """The script exits 0 and leaves a loadable plan.json and the report (23-49 s on a 2-core CPU)."""
    from autoao import Plan

    out = tmp_path / "out"
    env = {**os.environ, "AUTOAO_CACHE_DIR": str(tmp_path / "cache")}  # cold, and the user's cache untouched
    done = subprocess.run([sys.executable, str(SCRIPT), str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "same outputs; report:" in done.stdout
    for name in ("plan.json", "my_plan.json"):
        assert Plan.load(out / name).layers == Plan.load(out / "plan.json").layers
    assert (out / "report.html").stat().st_size > 0
    assert (out / "summary.json").is_file()
