"""The documentation points at files that exist, and benchmarks/ stays a tool: at most 12 entry
points, a dated log of at most 400 lines, at most 5 MB of results. Reads files only.

Checked in README.md, ARCHITECTURE.md, docs/*.md and benchmarks/*.md: every relative link (inline
or a reference definition; anchors are not checked, their file is), every backticked
`benchmarks/...` path (placeholders such as <date> or globs left out), in benchmarks/*.md every
backticked `results/20...` path (relative to benchmarks/), and every script a command runs
(`python benchmarks/x.py`, `bash benchmarks/x.sh`, `source benchmarks/x.sh`). The package's
comments may cite docs and benchmarks pages: those must exist too."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_SCRIPTS = 12  # maintained entry points directly in benchmarks/ (helpers live in benchmarks/lib/)
MAX_NOTES_LINES = 400
MAX_RESULTS_BYTES = 5 * 2**20  # the files' bytes under benchmarks/results (du -sh also counts blocks)

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)  # fenced code holds no links
INLINE = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?")
REFERENCE = re.compile(r"^ {0,3}\[[^\]\n]+\]:\s*<?([^\s>]+)>?", re.M)
SPAN = re.compile(r"`([^`]+)`")
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.")
SCRIPT = re.compile(r"\b(?:python3?|bash|source)\s+(benchmarks/[\w./-]+\.(?:py|sh))\b")
PACKAGE = ("autoao", "kernels", "search_space", "evaluators", "reports")
CITED = re.compile(r"(?<![\w./-])((?:docs|benchmarks)/[\w./-]*\w)")


def pages(root: Path) -> list[Path]:
    """The Markdown pages whose links are checked."""
    return [p for p in [root / "README.md", root / "ARCHITECTURE.md", *sorted((root / "docs").glob("*.md")),
                        *sorted((root / "benchmarks").glob("*.md"))] if p.is_file()]


def _paths_in_spans(text: str, prefix: str) -> list[str]:
    """Backticked paths that start with `prefix`, without placeholders, trailing punctuation cut."""
    found = []
    for span in SPAN.findall(text):
        for token in re.findall(rf"(?<![\w./:~-]){re.escape(prefix)}[^\s`'\"(),;\]]*", span):
            if not PLACEHOLDER.search(token):
                found.append(token.rstrip(".:"))
    return found


def broken_links(page: Path, root: Path) -> list[str]:
    """'page: target' for each link, backticked path or script of `page` that names nothing on disk."""
    text = page.read_text(encoding="utf-8")
    prose = FENCE.sub("", text)
    checks = []  # (as written, the file it must be)
    for target in INLINE.findall(prose) + REFERENCE.findall(prose):
        if re.match(r"[a-zA-Z][\w+.-]*:", target) or target.startswith("#"):
            continue  # https:, mailto:, an anchor on this page
        path = target.split("#", 1)[0].split("?", 1)[0]
        checks.append((target, page.parent / path))
    checks += [(p, root / p) for p in _paths_in_spans(prose, "benchmarks/")]
    if page.parent == root / "benchmarks":
        checks += [(p, page.parent / p) for p in _paths_in_spans(prose, "results/20")]
    checks += [(s, root / s) for s in SCRIPT.findall(text)]
    where = page.relative_to(root)
    return [f"{where}: {shown}" for shown, path in checks if not path.exists()]


def test_every_link_and_benchmarks_path_in_the_docs_resolves():
    assert len(pages(ROOT)) >= 10  # README, ARCHITECTURE, docs/, benchmarks/ all found
    broken = [b for page in pages(ROOT) for b in broken_links(page, ROOT)]
    assert not broken, "links and paths that name nothing in this checkout:\n" + "\n".join(broken)


def test_the_link_check_can_fail(tmp_path):
    """A broken link, a broken backticked path, a missing results folder and a missing script are
    each reported once; good ones, anchors, URLs, placeholders and fenced code are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks" / "results" / "2026-01-01-cpu").mkdir(parents=True)
    (tmp_path / "benchmarks" / "run.py").write_text("")
    (tmp_path / "docs" / "good.md").write_text("# Good\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("\n".join([
        "[good](good.md#good) [anchor](#x) [web](https://example.com) [folder](../benchmarks/results/)",
        "[broken](missing.md#somewhere) and `benchmarks/run.py`, `benchmarks/gone.py --flag`,",
        "`benchmarks/results/<date>-cpu/` and `benchmarks/results/*/x` are placeholders.",
        "[ref]: ../benchmarks/nothing/",
        "```", "[in code](not-a-link.md)", "```",
        "    python benchmarks/run.py --out x && python3 benchmarks/old.py",
    ]) + "\n")
    notes = tmp_path / "benchmarks" / "NOTES.md"
    notes.write_text("`results/2026-01-01-cpu/` exists, `results/2026-01-02-cpu/x.md` does not\n")

    assert broken_links(page, tmp_path) == ["docs/page.md: missing.md#somewhere", "docs/page.md: ../benchmarks/nothing/",
                                            "docs/page.md: benchmarks/gone.py", "docs/page.md: benchmarks/old.py"]
    assert broken_links(notes, tmp_path) == ["benchmarks/NOTES.md: results/2026-01-02-cpu/x.md"]
    assert broken_links(tmp_path / "docs" / "good.md", tmp_path) == []


def test_benchmarks_keeps_its_limits():
    bench = ROOT / "benchmarks"
    scripts = sorted(p.name for p in bench.iterdir()
                     if p.is_file() and p.suffix in (".py", ".sh") and p.name != "__init__.py")
    assert len(scripts) <= MAX_SCRIPTS, f"{len(scripts)} entry points in benchmarks/ (at most {MAX_SCRIPTS}): {scripts}"
    notes = len((bench / "NOTES.md").read_text(encoding="utf-8").splitlines())
    assert notes <= MAX_NOTES_LINES, (f"benchmarks/NOTES.md has {notes} lines (at most {MAX_NOTES_LINES}): "
                                      "move lasting analysis to docs/ and shorten the log")
    size = sum(p.stat().st_size for p in (bench / "results").rglob("*") if p.is_file())
    assert size <= MAX_RESULTS_BYTES, (f"benchmarks/results holds {size / 2**20:.1f} MB (at most "
                                       f"{MAX_RESULTS_BYTES / 2**20:.0f} MB): keep what a document links")


def test_the_package_cites_pages_that_exist():
    """A comment that cites docs/x.md or benchmarks/y names a file of this checkout."""
    missing = []
    for folder in PACKAGE:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".j2", ".cu"):
                for cited in set(CITED.findall(path.read_text(encoding="utf-8"))):
                    if not (ROOT / cited).exists():
                        missing.append(f"{path.relative_to(ROOT)}: {cited}")
    assert not missing, "cited pages that do not exist:\n" + "\n".join(sorted(missing))


MAX_ARCHITECTURE_LINES = 200


def test_the_architecture_page_stays_short_and_names_files_that_exist():
    """ARCHITECTURE.md is a map, not a manual: at most MAX_ARCHITECTURE_LINES lines, and every
    package path it names in backticks or in its stage diagram exists."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    assert len(text.splitlines()) <= MAX_ARCHITECTURE_LINES
    named = set(re.findall(r"\b((?:autoao|kernels|evaluators|search_space|reports)/[\w/]+\.py)\b", text))
    assert len(named) > 10  # the page names the modules it describes
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert missing == [], f"ARCHITECTURE.md names files that do not exist: {missing}"


def test_results_hold_results_not_scripts(tmp_path):
    """A script that made a result is a maintained entry point (benchmarks/*.py) or lives in git
    history, cited by the result's README; benchmarks/results holds no code."""
    def scripts(root: Path) -> list[str]:
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.suffix in (".py", ".sh"))

    assert scripts(ROOT / "benchmarks" / "results") == []
    (tmp_path / "2026-01-01-cpu").mkdir()
    (tmp_path / "2026-01-01-cpu" / "run.sh").write_text("echo\n")
    assert scripts(tmp_path) == ["2026-01-01-cpu/run.sh"]
