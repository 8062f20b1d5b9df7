"""Notebook hygiene: what nbval cannot see, checked on the committed files.

Every notebook stores outputs for every code cell, run once from top to bottom, with no
errors, memory addresses or absolute paths in them, and one output block per stream (a cell
that prints in a loop stores one ``stdout`` output, not one per line, each of which the book
would show in a box of its own); no cell asserts on a wall-clock time; every
result the text quotes (a number with three decimals, or a time or speed with its unit) is one
that a stored output prints; and it opens as the guide says: a title
with an "Open in Colab" badge for this very file, then a Colab-only set-up cell that nbval
skips and the book hides, then imports with ``seed_everything`` and a device choice.
"""

import copy
import json
import re
from pathlib import Path

import pytest

from timing_asserts import order_asserts_beside_timers, timing_asserts

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REPO = re.search(r"url:\s*https://github\.com/(\S+)", (ROOT / "_config.yml").read_text()).group(1)
MEASURED = re.compile(r"(?<![\d.])\d+\.\d{3}(?!\d|\.\d)")  # a quoted result: 3 decimals
TIMED = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s?(?:µs|ms|GB/s|GFLOP/s)")  # a quoted time or speed
EXERCISE = re.compile(r"^`{3,}\{exercise\}\s*\n:label: (\S+)", re.M)
SOLUTION = re.compile(r"^`{3,}\{solution(-start)?\} (\S+)", re.M)
UNFINISHED = re.compile(r"\bTODO\b|\bTBD\b|to write\]|\bFIXME\b")  # a placeholder left in the text
LEAKS = re.compile(r"0x[0-9a-fA-F]{6,}|/home/|/root/|/tmp/|/Users/|[A-Z]:\\\\|site-packages|Traceback")


def source(cell) -> str:
    return "".join(cell["source"])


def output_text(out) -> str:
    return "".join(out.get("text", "")) + json.dumps(
        {k: v for k, v in out.get("data", {}).items() if k != "image/png"}
    ) + "".join(out.get("traceback", []))


def problems(nb: dict, relpath: str) -> list[str]:
    """Everything wrong with one notebook, as readable messages (empty when it is clean)."""
    found = []
    cells = nb["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    counts = [c.get("execution_count") for c in code]
    if None in counts:
        found.append(f"{counts.count(None)} of {len(code)} code cells were never executed: run all, then commit")
    elif counts != list(range(1, len(code) + 1)):
        found.append(f"execution counts are {counts}, not 1..{len(code)}: restart the kernel and run all")
    if not any(c.get("outputs") for c in code):
        found.append("no code cell stores any output")
    for i, c in enumerate(code):
        outputs = c.get("outputs", [])
        for before, after in zip(outputs, outputs[1:]):
            if before.get("output_type") == after.get("output_type") == "stream" and before.get("name") == after.get("name"):
                found.append(f"code cell {i} stores two {after.get('name')} outputs in a row, which the book shows as "
                             "two boxes: merge them into one (re-execute with a runner that merges streams)")
                break
        if "show_source(" in source(c) and not outputs:
            found.append(f"code cell {i} calls show_source but stores no output: the book would show no code "
                         "(inside a loop, display(show_source(...)))")
        for out in outputs:
            if out.get("output_type") == "error":
                found.append(f"code cell {i} stores an error: {out.get('ename')}")
            leak = LEAKS.search(output_text(out))
            if leak:
                found.append(f"code cell {i} output contains {leak.group(0)!r} (an address, path or traceback)")
    sources = [source(c) for c in code]
    for i, line, statement in timing_asserts(sources):
        found.append(f"code cell {i}, line {line} asserts on a wall-clock time ({statement}): under load times "
                     "and their order change from run to run; print times, assert on operator counts, bytes or FLOPs")
    for i, line, statement in order_asserts_beside_timers(sources):
        found.append(f"code cell {i}, line {line} times something and asserts an order ({statement}): "
                     "print the times there, and assert on counts or bytes in a cell that does not time")
    badge = f"https://colab.research.google.com/github/{REPO}/blob/main/{relpath}"
    if len(cells) < 3:
        return found + ["fewer than three cells: title, Colab set-up and imports are required"]
    first, second, third = cells[:3]
    if first["cell_type"] != "markdown" or not source(first).startswith("# "):
        found.append("the first cell must be markdown starting with the chapter title ('# ...')")
    if badge not in source(first) or "colab-badge.svg" not in source(first):
        found.append(f"the first cell must carry an Open in Colab badge linking to {badge}")
    tags = set(second.get("metadata", {}).get("tags", []))
    if second["cell_type"] != "code" or "google.colab" not in source(second):
        found.append("the second cell must be the Colab set-up code cell (checks 'google.colab' in sys.modules)")
    if not {"nbval-skip", "remove-cell"} <= tags:
        found.append(f"the Colab set-up cell must be tagged nbval-skip and remove-cell, has {sorted(tags)}")
    if third["cell_type"] != "code" or "seed_everything(" not in source(third) or "default_device()" not in source(third):
        found.append("the third cell must import, call seed_everything(...) and choose the device with default_device()")
    if "# NBVAL_" in "".join(source(c) for c in code):
        found.append("use nbval metadata tags, not '# NBVAL_' comments (comments show in the book)")
    found += exercise_problems(cells)
    printed = "".join(output_text(out) for c in code for out in c.get("outputs", []))
    for c in cells:
        if c["cell_type"] == "markdown":
            if UNFINISHED.search(source(c)):
                found.append(f"a markdown cell is unfinished: {UNFINISHED.search(source(c)).group(0)!r}")
            for number in MEASURED.findall(source(c)) + TIMED.findall(source(c)):
                if number not in printed:
                    found.append(f"the text quotes {number}, which no stored output prints")
    return found


def exercise_problems(cells: list[dict]) -> list[str]:
    """The chapter ends with an "## Exercises" section of sphinx-exercise exercises, each with
    one solution hidden in a dropdown; code in a solution sits in code cells between
    ``{solution-start}`` and ``{solution-end}``, so that it runs."""
    found = []
    text = [source(c) if c["cell_type"] == "markdown" else "" for c in cells]
    start = next((i for i, t in enumerate(text) if re.search(r"^## Exercises\s*$", t, re.M)), None)
    if start is None:
        return ["no '## Exercises' section"]
    after = "\n".join(text[start:])
    if re.search(r"^#{1,2} ", after.split("## Exercises", 1)[1], re.M):
        found.append("the Exercises section must be the chapter's last section")
    labels = EXERCISE.findall(after)
    if len(labels) < 2:
        found.append(f"{len(labels)} exercises ({{exercise}} blocks with a :label:) after '## Exercises'; at least 2 expected")
    if EXERCISE.findall("\n".join(text[:start])):
        found.append("exercises must sit in the Exercises section")
    solved = [label for _, label in SOLUTION.findall(after)]
    for label in labels:
        if solved.count(label) != 1:
            found.append(f"exercise {label} has {solved.count(label)} solutions, expected 1")
    found += [f"a solution refers to {label}, which is no exercise here" for label in set(solved) - set(labels)]
    gates = re.findall(r"^`{3,}\{(solution-start|solution-end)\}", after, re.M)
    if gates != ["solution-start", "solution-end"] * (len(gates) // 2) or len(gates) % 2:
        found.append(f"solution-start and solution-end must alternate, found {gates}")
    for block in re.findall(r"^`{3,}\{solution(?:-start)?\}[^\n]*\n((?::\w+:.*\n)*)", after, re.M):
        if ":class: dropdown" not in block:
            found.append("every solution must be hidden with ':class: dropdown'")
    if "{admonition} Solution" in after:
        found.append("solutions use sphinx-exercise's {solution}, not an admonition")
    return found


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/*.ipynb found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_hygiene(path):
    assert problems(load(path), path.relative_to(ROOT).as_posix()) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_in_the_table_of_contents(path):
    assert f"file: notebooks/{path.stem}\n" in (ROOT / "_toc.yml").read_text()


def test_every_notebook_has_the_same_set_up_cell():
    """One Colab set-up cell for the whole book, which also tells a reader whose kernel lacks
    lnbook how to fix it (tests/test_install.py runs it)."""
    setup = {path.name: source(load(path)["cells"][1]) for path in NOTEBOOKS}
    assert [name for name, text in setup.items() if text != setup[NOTEBOOKS[0].name]] == []
    assert "except ModuleNotFoundError" in setup[NOTEBOOKS[0].name]


def test_hygiene_check_catches_a_stripped_notebook():
    path = NOTEBOOKS[0]
    nb = copy.deepcopy(load(path))
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            c["outputs"], c["execution_count"] = [], None
    found = problems(nb, path.relative_to(ROOT).as_posix())
    assert any("never executed" in p for p in found) and any("no code cell stores" in p for p in found)


def test_hygiene_check_catches_a_number_no_cell_printed():
    path = NOTEBOOKS[0]
    nb = copy.deepcopy(load(path))
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": ["BatchNorm reached 0.987."]})
    assert "the text quotes 0.987, which no stored output prints" in problems(nb, path.relative_to(ROOT).as_posix())


def test_hygiene_check_catches_a_timing_assert_and_a_stale_timing():
    path = NOTEBOOKS[0]
    nb = copy.deepcopy(load(path))
    nb["cells"].append({"cell_type": "code", "metadata": {"tags": ["nbval-ignore-output"]}, "outputs": [],
                        "execution_count": len([c for c in nb["cells"] if c["cell_type"] == "code"]) + 1,
                        "source": "t = bench.median_times(fns)\nprint(f\"{t['a'] * 1e3:.1f} ms\")\nassert t['a'] < t['b']"})
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": ["In the run shown, one call takes 987.6 µs."]})
    found = problems(nb, path.relative_to(ROOT).as_posix())
    assert any(p.startswith("code cell") and "asserts on a wall-clock time (assert t['a'] < t['b'])" in p for p in found)
    assert "the text quotes 987.6, which no stored output prints" in found
    nb["cells"][-2]["source"] = "t = bench.median_times(fns)\nops = {n: bench.count_ops(f) for n, f in fns.items()}\nassert ops['a'] < ops['b']"
    found = problems(nb, path.relative_to(ROOT).as_posix())
    assert [p for p in found if "asserts" in p] == [
        f"code cell {len([c for c in nb['cells'] if c['cell_type'] == 'code']) - 1}, line 3 times something and asserts an order "
        "(assert ops['a'] < ops['b']): print the times there, and assert on counts or bytes in a cell that does not time"]


def test_exercise_check_catches_a_missing_solution_and_an_open_gate():
    md = lambda text: {"cell_type": "markdown", "metadata": {}, "source": text}
    cells = [md("# T"), md("## Exercises\n\n```{exercise}\n:label: ex-a\n\nA.\n```\n\n```{exercise}\n:label: ex-b\n\nB.\n```"),
             md("````{solution-start} ex-a\n:class: dropdown\n````"), {"cell_type": "code", "source": "1"}]
    assert exercise_problems(cells) == [
        "exercise ex-b has 0 solutions, expected 1",
        "solution-start and solution-end must alternate, found ['solution-start']"]
    cells.append(md("````{solution-end}\n````\n```{solution} ex-b\n\nshown\n```"))
    assert exercise_problems(cells) == ["every solution must be hidden with ':class: dropdown'"]
    assert exercise_problems(cells[:1]) == ["no '## Exercises' section"]


def test_hygiene_check_catches_a_stream_split_into_blocks():
    path = NOTEBOOKS[0]
    nb = copy.deepcopy(load(path))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    stream = lambda name, text: {"output_type": "stream", "name": name, "text": text}
    code[-1]["outputs"] = [stream("stdout", "run 0\n"), stream("stderr", "warning\n"), stream("stdout", "run 1\n")]
    assert not any("in a row" in p for p in problems(nb, path.relative_to(ROOT).as_posix()))  # alternating: fine
    code[-1]["outputs"].append(stream("stdout", ["run 2\n"]))
    assert [p for p in problems(nb, path.relative_to(ROOT).as_posix()) if "in a row" in p] == [
        f"code cell {len(code) - 1} stores two stdout outputs in a row, which the book shows as two boxes: "
        "merge them into one (re-execute with a runner that merges streams)"]


def test_hygiene_check_catches_leaks_order_and_a_wrong_badge():
    path = NOTEBOOKS[0]
    nb = copy.deepcopy(load(path))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    code[-1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "<object at 0x7f3a2b1c9d00>\n"}]
    code[0]["execution_count"], code[1]["execution_count"] = code[1]["execution_count"], code[0]["execution_count"]
    found = problems(nb, "notebooks/some_other_name.ipynb")
    assert any("0x7f3a2b1c9d00" in p for p in found)
    assert any("restart the kernel" in p for p in found)
    assert any("Open in Colab badge" in p for p in found)


def test_hygiene_check_catches_a_placeholder_left_in_the_text():
    nb = load(NOTEBOOKS[0])
    nb = copy.deepcopy(nb)
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": ["**[t5: to write]**"]})
    assert any("unfinished" in p for p in problems(nb, f"notebooks/{NOTEBOOKS[0].name}"))
