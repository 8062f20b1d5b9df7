"""The book around the chapters: landing page, bibliography, reproducibility page, and an
install that leaves a reader's torch alone (as on Colab)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from notebook_times import markdown, notebook_times

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BIB = (ROOT / "book" / "references.bib").read_text()
ENTRIES = dict(re.findall(r"@\w+\{([^,\s]+),(.*?)\n\}", BIB, re.S))
CITE = re.compile(r"\{cite(?::\w+)?\}`([^`]+)`")


def markdown_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown")
    return path.read_text()


PAGES = NOTEBOOKS + sorted((ROOT / "book").glob("*.md"))
CITED = {key.strip() for page in PAGES for keys in CITE.findall(markdown_of(page)) for key in keys.split(",")}


def test_every_chapter_cites_through_the_bibliography():
    assert [p.name for p in NOTEBOOKS if not CITE.search(markdown_of(p))] == []


def test_every_cited_key_is_in_the_bibliography_and_every_entry_is_cited():
    assert sorted(CITED - set(ENTRIES)) == []
    assert sorted(set(ENTRIES) - CITED) == []


@pytest.mark.parametrize("key", sorted(ENTRIES))
def test_every_entry_can_be_found(key):
    """A DOI, an arXiv id, or (for reports and datasheets that have neither) a URL."""
    fields = set(re.findall(r"^\s*(\w+)\s*=", ENTRIES[key], re.M))
    assert fields & {"doi", "eprint", "url"}, f"{key} has no doi, eprint or url"
    if "eprint" in fields:
        assert re.search(r"archiveprefix\s*=\s*\{arXiv\}", ENTRIES[key]), f"{key}: an eprint needs archiveprefix = {{arXiv}}"
        assert re.search(r"eprint\s*=\s*\{\d{4}\.\d{4,5}\}", ENTRIES[key]), f"{key}: eprint is not an arXiv id"


def test_the_landing_page_links_every_chapter():
    intro = (ROOT / "book" / "intro.md").read_text()
    assert [p.name for p in NOTEBOOKS if f"(../notebooks/{p.name})" not in intro] == []
    assert re.search(r"```\{glue\} \S+\n:doc: \.\./notebooks/\S+\.ipynb\n```", intro), "the landing page shows a figure from a chapter"


def test_the_reproducibility_page_includes_the_measured_times():
    page = (ROOT / "book" / "reproducibility.md").read_text()
    assert "```{include} ../_build/test-logs/notebook-times.md" in page
    assert "file: book/reproducibility\n" in (ROOT / "_toc.yml").read_text()


def test_notebook_times_add_up_each_notebooks_cells(tmp_path):
    xml = tmp_path / "nbval.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest" time="9.5">'
        '<testcase classname="notebooks.00_quickstart.ipynb" name="Cell 0" time="1.5"/>'
        '<testcase classname="notebooks.00_quickstart.ipynb" name="Cell 1" time="2.25"/>'
        '<testcase classname="notebooks.05_layernorm_in_rnns.ipynb" name="Cell 0" time="130"/>'
        "</testsuite></testsuites>")
    times, wall = notebook_times(xml)
    assert times == {"00_quickstart": (2, 3.75), "05_layernorm_in_rnns": (1, 130.0)} and wall == 9.5
    table = markdown(times, wall, {"date": "2026-12-02", "device": "a CPU (2 threads)", "torch": "2.13.0", "triton": "3.7.1"})
    assert "| {doc}`/notebooks/00_quickstart` | 2 | 4 |" in table
    assert "| {doc}`/notebooks/05_layernorm_in_rnns` | 1 | 130 (over 120 s) |" in table
    assert "2 notebooks, two at a time: 10 s of wall time" in table


def test_notebook_times_refuse_xml_that_is_not_from_nbval(tmp_path):
    xml = tmp_path / "tests.xml"
    xml.write_text('<testsuite><testcase classname="tests.test_utils" name="test_x" time="1"/></testsuite>')
    with pytest.raises(ValueError, match="not a notebook cell"):
        notebook_times(xml)


def test_dependencies_have_no_upper_bounds_or_pins():
    """An upper bound or a pin could make pip replace the torch a reader (or Colab) already has."""
    text = (ROOT / "pyproject.toml").read_text()
    deps = [Requirement(d) for d in re.findall(r'^\s*"([^"]+)",', text.split("dependencies = [")[1].split("]")[0], re.M)]
    assert {d.name for d in deps} >= {"torch", "numpy"}
    assert [str(d) for d in deps if any(s.operator not in (">=", ">") for s in d.specifier)] == []


def test_installing_lnbook_upgrades_nothing_already_installed(tmp_path):
    """pip's own resolver, offline, against this environment's torch: lnbook is all it would add."""
    report = tmp_path / "report.json"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                          "--quiet", "--report", str(report), str(ROOT)], capture_output=True, text=True)
    assert pip.returncode == 0, f"pip cannot install lnbook next to what is installed:\n{pip.stderr}"
    would_install = [i["metadata"]["name"] for i in json.loads(report.read_text())["install"]]
    assert would_install == ["lnbook"]
