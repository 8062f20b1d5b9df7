"""The book around the chapters: landing page, bibliography, reproducibility page, and chapter
and exercise numbers that match the notebooks' numbers."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
        '<testcase classname="notebooks.05_layernorm_in_rnns.ipynb" name="Cell 0" time="190"/>'
        "</testsuite></testsuites>")
    times, wall = notebook_times(xml)
    assert times == {"00_quickstart": (2, 3.75), "05_layernorm_in_rnns": (1, 190.0)} and wall == 9.5
    table = markdown(times, wall, {"date": "2026-12-02", "device": "a CPU (2 threads)", "torch": "2.13.0", "triton": "3.7.1"})
    assert "| {doc}`/notebooks/00_quickstart` | 2 | 4 |" in table
    assert "| {doc}`/notebooks/05_layernorm_in_rnns` | 1 | 190 (over 180 s) |" in table
    assert "2 notebooks, two at a time: 10 s of wall time" in table


def test_notebook_times_refuse_xml_that_is_not_from_nbval(tmp_path):
    xml = tmp_path / "tests.xml"
    xml.write_text('<testsuite><testcase classname="tests.test_utils" name="test_x" time="1"/></testsuite>')
    with pytest.raises(ValueError, match="not a notebook cell"):
        notebook_times(xml)


TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
EXERCISE_TITLE = re.compile(r'<p class="admonition-title"><span class="caption-number">Exercise ([\d.]+) </span>')
CHAPTER_TITLE = re.compile(r'<h1><span class="section-number">([\d.]+) </span>')


def chapter_numbers(toc: dict) -> dict[str, int | None]:
    """Each file of the table of contents with the number Sphinx gives its title: parts with
    ``numbered`` count on from the last numbered chapter (multitoc numbering), others give none."""
    numbers, last = {}, 0
    for part in toc["parts"]:
        for chapter in part["chapters"]:
            if part.get("numbered"):
                last += 1
            numbers[chapter["file"]] = last if part.get("numbered") else None
    return numbers


def test_chapters_are_numbered_as_their_notebooks():
    """Chapter NN_name is chapter NN in the sidebar, in its title and in its exercises' numbers
    ("Exercise 2.1"); the quickstart (00) is unnumbered, and its exercises read 1, 2, ..."""
    expected = {f"notebooks/{p.stem}": int(p.stem[:2]) or None for p in NOTEBOOKS}
    assert {f: n for f, n in chapter_numbers(TOC).items() if f.startswith("notebooks/")} == expected
    # One level deep: a deeper number would prefix the chapters' own headings ("2.1 1. Padding ...").
    assert {part["caption"]: part["numbered"] for part in TOC["parts"] if "numbered" in part} == {
        part["caption"]: 1 for part in TOC["parts"] if part.get("numbered")}
    assert CONFIG["html"].get("use_multitoc_numbering", True) is True, "numbering would restart at 1 in every part"
    assert CONFIG["sphinx"]["config"].get("numfig_secnum_depth", 1) == 1, "exercise numbers must carry the chapter number"


def test_chapter_numbers_follow_the_parts():
    toc = {"parts": [{"caption": "a", "chapters": [{"file": "x"}]},
                     {"caption": "b", "numbered": 1, "chapters": [{"file": "y"}, {"file": "z"}]},
                     {"caption": "c", "numbered": 1, "chapters": [{"file": "w"}]}]}
    assert chapter_numbers(toc) == {"x": None, "y": 1, "z": 2, "w": 3}


def test_a_built_book_numbers_exercises_per_chapter(tmp_path):
    """This book's _config.yml and _toc.yml built by Jupyter Book around stub chapters of two
    exercises each: chapter NN's title reads "NN." and its exercises "Exercise NN.1" and
    "NN.2" (and a cross-reference the same), not numbers counted across the whole book."""
    for name in ("_config.yml", "_toc.yml", "book/references.bib"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    (tmp_path / f"{TOC['root']}.md").write_text("# Stub landing page\n")
    numbers = chapter_numbers(TOC)
    for file in numbers:
        stem = Path(file).name
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        exercises = "".join(f"```{{exercise}}\n:label: ex-{stem}-{k}\n\nDo {k}.\n```\n\n" for k in "ab")
        (tmp_path / f"{file}.md").write_text(f"# Stub {stem}\n\nSee {{numref}}`ex-{stem}-b`.\n\n## Exercises\n\n{exercises}"
                                             if file.startswith("notebooks/") else f"# Stub {stem}\n")
    build = subprocess.run([str(Path(sys.executable).with_name("jupyter-book")), "build", str(tmp_path), "-W", "-n"],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    for file, number in numbers.items():
        if not file.startswith("notebooks/"):
            continue
        html = (tmp_path / "_build" / "html" / f"{file}.html").read_text()
        prefix = "" if number is None else f"{number}."
        assert EXERCISE_TITLE.findall(html) == [f"{prefix}1", f"{prefix}2"], file
        assert CHAPTER_TITLE.findall(html) == ([] if number is None else [f"{number}."]), file
        assert f'<span class="std std-numref">Exercise {prefix}2</span>' in html, file
