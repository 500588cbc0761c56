"""Results anyone can trace: every benchmark writes a raw file with the run's facts, every raw file
written since has them, and the results pages link the raw file of each table.

Every results table has a raw file in its section and every raw file has the run's facts: the
results from before raw files existed were re-run or turned into prose that says it has no raw
file (issue 34). Nothing is run here: the sources and files are read."""
from __future__ import annotations

import json
import os
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
    assert missing == 0, (
        f"docs/results/{page.name}: {missing} tables without a raw file in their section; "
        f"link the benchmarks/results/*.json the table was made from")


def raw_files() -> list[Path]:
    return sorted(RESULTS.glob("*.json"))


@pytest.mark.parametrize("path", raw_files(), ids=lambda p: p.name)
def test_raw_files_carry_the_run_facts(path):
    data = json.loads(path.read_text())
    facts = data.get("facts") if isinstance(data, dict) else None
    assert isinstance(facts, dict), f"{path.name}: no 'facts' (write it with provenance.write_raw)"
    absent = [key for key in provenance.REQUIRED if key not in facts]
    assert not absent, f"{path.name}: facts without {absent}"
    assert facts["load_end"] is not None, f"{path.name}: the run's end was never stamped"


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


def test_the_mpi_tuning_variables_set_are_facts(monkeypatch):
    for name in [k for k in os.environ if k.startswith(provenance.MPI_TUNING)]:
        monkeypatch.delenv(name)
    assert "mpi_env" not in provenance.facts()
    monkeypatch.setenv("MPIR_CVAR_CH4_CMA_ENABLE", "1")
    monkeypatch.setenv("OMPI_MCA_btl", "self,vader")
    monkeypatch.setenv("MPIR_NOT_A_CVAR", "x")
    assert provenance.facts()["mpi_env"] == {"MPIR_CVAR_CH4_CMA_ENABLE": "1", "OMPI_MCA_btl": "self,vader"}


def test_whether_the_ranks_copy_large_messages_once_is_a_fact(monkeypatch):
    # Launched ranks decide it themselves (native_coll.mpienv.with_cma); a benchmark that launches
    # them records the same probe's answer, or the variable where it is set.
    import native_coll.mpienv as mpienv
    monkeypatch.delenv("MPIR_CVAR_CH4_CMA_ENABLE", raising=False)
    monkeypatch.setattr(mpienv, "cma_allowed", lambda: True)
    assert provenance.facts()["mpi_single_copy"] == "on (the ranks' probe)"
    monkeypatch.setattr(mpienv, "cma_allowed", lambda: False)
    assert provenance.facts()["mpi_single_copy"] == "off (the ranks' probe)"
    monkeypatch.setenv("MPIR_CVAR_CH4_CMA_ENABLE", "0")
    assert provenance.facts()["mpi_single_copy"] == "off (MPIR_CVAR_CH4_CMA_ENABLE=0)"
