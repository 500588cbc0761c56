"""Results anyone can trace: every benchmark writes a raw file with the run's facts, every raw file
written since has them, and the results pages link the raw file of each table.

The results from before raw files existed are counted per page (``NO_RAW_FILE``) and per file
(``LEGACY_RAW``): a new table or raw file must come with its facts, and the counts may only fall as
the benchmarks are re-run (issue 34). Nothing is run here: the sources and files are read."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import provenance  # noqa: E402

BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
PAGES = sorted((ROOT / "docs" / "results").glob("*.md"))

# Scripts that make no figures of their own: plots, pictures and the README's table drawn from run
# folders and raw files that other benchmarks wrote, and the shared module itself.
NOT_BENCHMARKS = {"provenance.py", "modes_plot.py", "tensorboard_screenshot.py", "headline.py"}

# Tables on the results pages without a raw file beside them, measured before benchmarks wrote
# one (2026-11-26). These numbers may only go down.
NO_RAW_FILE = {"cluster.md": 0, "collection.md": 0, "collective.md": 0, "environments.md": 0,
               "faults.md": 0, "gpu.md": 0, "optimizers.md": 1, "optimizers_first.md": 0,
               "overlap.md": 0, "scale.md": 0, "training.md": 0}

# Raw files written before provenance (a bare list or no "facts"); re-running their benchmark
# replaces them with files that have it.
LEGACY_RAW: set[str] = set()

HEADING = re.compile(r"^#{1,6} ", re.M)
TABLE_RULE = re.compile(r"^\|\s*:?-{3,}", re.M)
RAW_LINK = re.compile(r"benchmarks/results/([\w./-]+\.json)")


def sections(text: str) -> list[str]:
    """The page cut at its headings (the text before the first heading is a section too)."""
    starts = [0] + [m.start() for m in HEADING.finditer(text)] + [len(text)]
    return [text[a:b] for a, b in zip(starts, starts[1:]) if b > a]


def tables_without_raw(text: str) -> int:
    """How many tables sit in a section that names no existing raw JSON file."""
    missing = 0
    for part in sections(text):
        tables = len(TABLE_RULE.findall(part))
        linked = [name for name in RAW_LINK.findall(part) if (RESULTS / name).is_file()]
        if tables and not linked:
            missing += tables
    return missing


def test_the_section_reader_counts_tables_and_links():
    page = ("# A\n\n| a |\n|---|\n| 1 |\n\n## B\n\n| b |\n|---:|\n| 2 |\n\n"
            "Raw: benchmarks/results/gpu_h100.json\n\n## C\n\nno table\n")
    assert tables_without_raw(page) == 1
    assert tables_without_raw(page.replace("gpu_h100.json", "no_such_file.json")) == 2


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_results_tables_link_their_raw_files(page):
    missing = tables_without_raw(page.read_text())
    allowed = NO_RAW_FILE.get(page.name, 0)
    assert missing <= allowed, (
        f"docs/results/{page.name}: {missing} tables without a raw file in their section "
        f"(at most {allowed}); link the benchmarks/results/*.json the table was made from")


def test_no_raw_file_counts_are_current():
    """When a page gains raw links, its count here is lowered in the same change."""
    stale = {p.name: (NO_RAW_FILE.get(p.name, 0), tables_without_raw(p.read_text()))
             for p in PAGES if tables_without_raw(p.read_text()) < NO_RAW_FILE.get(p.name, 0)}
    assert not stale, f"lower NO_RAW_FILE to the current counts (allowed, now): {stale}"


def raw_files() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.json") if p.name not in LEGACY_RAW)


@pytest.mark.parametrize("path", raw_files(), ids=lambda p: p.name)
def test_raw_files_carry_the_run_facts(path):
    data = json.loads(path.read_text())
    facts = data.get("facts") if isinstance(data, dict) else None
    assert isinstance(facts, dict), f"{path.name}: no 'facts' (write it with provenance.write_raw)"
    absent = [key for key in provenance.REQUIRED if key not in facts]
    assert not absent, f"{path.name}: facts without {absent}"
    assert facts["load_end"] is not None, f"{path.name}: the run's end was never stamped"


def test_legacy_list_names_only_files_that_still_lack_facts():
    upgraded = []
    for name in sorted(LEGACY_RAW):
        path = RESULTS / name
        if not path.is_file():
            upgraded.append(f"{name} (gone)")
            continue
        data = json.loads(path.read_text())
        facts = data.get("facts") if isinstance(data, dict) else None
        if isinstance(facts, dict) and set(provenance.REQUIRED) <= set(facts) \
                and facts["load_end"] is not None:
            upgraded.append(name)
    assert not upgraded, f"remove from LEGACY_RAW: {upgraded}"


BENCHMARKS = sorted(p for p in BENCH.glob("*.py") if p.name not in NOT_BENCHMARKS)


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_every_benchmark_writes_its_facts(script):
    source = script.read_text()
    assert re.search(r"\bprovenance\.(write_raw|facts)\(", source), (
        f"benchmarks/{script.name} writes no raw file with the run's facts: call "
        f"benchmarks/provenance.py's facts() at its start and write_raw() at its end")


def test_write_raw_stamps_the_end_and_writes_whole(tmp_path):
    record = provenance.facts(config={"x": 1})
    assert record["load_end"] is None and record["config"] == {"x": 1}
    out = provenance.write_raw(tmp_path / "sub" / "r.json", record, rows=[{"a": 1}])
    data = json.loads(out.read_text())
    assert list(data) == ["facts", "rows"] and data["rows"] == [{"a": 1}]
    assert set(provenance.REQUIRED) <= set(data["facts"])
    assert data["facts"]["load_end"] is not None and data["facts"]["cores"] >= 1
    assert data["facts"]["torch"] != "none" and data["facts"]["mpi"] != "unknown"
    assert [p.name for p in out.parent.iterdir()] == ["r.json"]  # no temporary file left
    assert provenance.beside("a/b/table.md") == Path("a/b/table.json")
