"""Validation shim (not project code): benchmarks/e2e.py indexes res.summary as a dict, but the
refactored autoao.optimize returns a RunSummary dataclass. This wraps optimize so summary is
runfiles.to_dict(summary) (same keys as summary.json), then runs e2e.py unchanged."""
import runpy, sys
from pathlib import Path
import autoao
from autoao import runfiles
_orig = autoao.optimize
def _optimize(*a, **k):
    res = _orig(*a, **k)
    res.summary = runfiles.to_dict(res.summary)
    return res
autoao.optimize = _optimize
script = Path(__file__).resolve().parent.parent / "benchmarks" / "e2e.py"
sys.argv[0] = str(script)
runpy.run_path(str(script), run_name="__main__")
