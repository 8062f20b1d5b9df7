"""`make lab`'s path, tested in a real browser: `make lab` (tools/lab.py) serves working copies
of the chapters with JupyterLab from this environment; headless Chromium opens it, picks the book's kernel and runs
every cell; no cell may fail, a known output must appear, the figures must render, and a loop
through lnbook.progress (one cell added to the copy) must show its progress line. Every
request away from the server is blocked and recorded: the page must need none (offline)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import lab
from browser_check import ALLOWED_BLOCKED, local_browser

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "notebooks" / "00_quickstart.ipynb"
TOKEN = "lnbook-browser-test"
KNOWN_OUTPUT = "batch shape (B, T, F): (3, 5, 4)  lengths: [5, 2, 4]"
PROGRESS_CELL = "from lnbook.progress import progress\n\nfor _ in progress(range(3), 'a long loop'):\n    pass"
# True in the page once every code cell has run, or one has failed (Run All stops there).
FINISHED = """() => {
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')].map(p => p.textContent.trim());
  const stderr = [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')];
  return prompts.length > 0 && (prompts.every(p => /^\\[\\d+\\]:$/.test(p)) || stderr.some(e => /Traceback/.test(e.textContent)));
}"""
# Runs in the page: each code cell's prompt, error outputs, and whether each figure decodes.
INSPECT = """async () => {
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')];
  const images = [...document.querySelectorAll('.jp-Notebook .jp-RenderedImage img')];
  const decoded = await Promise.all(images.map(img => img.decode().then(() => img.naturalWidth > 0, () => false)));
  return {
    prompts: cells.map(c => c.querySelector('.jp-InputPrompt').textContent.trim()),
    errors: [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
      .map(e => e.textContent).filter(t => /Error|Traceback/.test(t)).map(t => t.slice(0, 500)),
    text: [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')].map(e => e.textContent).join('\\n'),
    decoded,
  };
}"""


def stored_figures(path: Path) -> int:
    """How many PNG figures the notebook's stored outputs hold."""
    cells = json.loads(path.read_text())["cells"]
    return sum("image/png" in out.get("data", {}) for c in cells if c["cell_type"] == "code" for out in c["outputs"])


def wait_for_server(server: subprocess.Popen, url: str, log: Path, seconds: float = 90) -> None:
    for _ in range(int(seconds / 0.3)):
        if server.poll() is not None:
            pytest.fail(f"JupyterLab exited with status {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"JupyterLab did not answer {url} within {seconds} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``(base URL, log)`` of JupyterLab started by ``make lab`` on working copies in a temporary
    folder, chapter 00's copy already there (a reader's copy stays as it is), its outputs cleared
    and one cell added; a second ``make lab`` on the same copies must give its address instead of
    starting another. Stopped afterwards, whatever happened."""
    copies = tmp_path_factory.mktemp("lab")
    nb = json.loads(CHAPTER.read_text())
    for cell in nb["cells"]:  # what the page shows afterwards must come from this run
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    nb["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": PROGRESS_CELL})
    (copies / "notebooks").mkdir()
    (copies / "notebooks" / CHAPTER.name).write_text(json.dumps(nb))
    log = copies.parent / "jupyterlab.log"
    port = lab.choose_port(18888)
    make = ["make", "--no-print-directory", "-C", str(ROOT), "lab", f"LAB_PORT={port}",
            f"LAB_ARGS=--no-browser --token {TOKEN} --copies {copies}"]
    environment = {**os.environ, "JUPYTER_DATA_DIR": str(copies.parent / "jupyter")}  # the kernel spec goes there
    with log.open("w") as out:
        server = subprocess.Popen(make, stdout=out, stderr=subprocess.STDOUT, env=environment, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(server, f"{base}/api/status?token={TOKEN}", log)
        second = subprocess.run([sys.executable, str(ROOT / "tools" / "lab.py"), "--no-browser", "--copies", str(copies)],
                                capture_output=True, text=True, env=environment, timeout=60)
        assert (second.returncode, second.stdout) == (0, f"JupyterLab already serves {copies}: open {base}/lab?token={TOKEN}\n")
        yield base, log
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # JupyterLab shuts its kernels down on SIGTERM
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert sorted(p.name for p in (copies / "notebooks").glob("*.ipynb")) == sorted(p.name for p in CHAPTER.parent.glob("*.ipynb"))


@pytest.fixture(scope="module")
def run_all(served, tmp_path_factory):
    """Open chapter 00, pick the kernel "lnbook", run all cells; what the page shows afterwards."""
    from playwright.sync_api import sync_playwright

    base, log = served
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    blocked: set[str] = set()
    js_errors: list[str] = []
    with sync_playwright() as pw:
        browser, context = local_browser(pw, chromium, base, blocked)
        page = context.new_page()
        page.on("pageerror", lambda e: js_errors.append(e.message))
        page.set_default_timeout(60_000)
        page.goto(f"{base}/?token={TOKEN}")  # make lab opens chapter 00
        kernel_name = page.locator(".jp-NotebookPanel-toolbar .jp-Toolbar-kernelName")
        kernel_name.filter(has_not_text="No Kernel").wait_for()  # the notebook's own kernel has started
        kernel_name.click()
        dialog = page.locator(".jp-Dialog")
        dialog.locator("select").select_option(label=lab.KERNEL_DISPLAY_NAME)
        dialog.locator(".jp-mod-accept").click()
        kernel_name.filter(has_text=lab.KERNEL_DISPLAY_NAME).wait_for()
        page.locator(".jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for()
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        page.wait_for_function(FINISHED, timeout=150_000)
        seen = page.evaluate(INSPECT)
        page.screenshot(path=str(tmp_path_factory.mktemp("screens") / "lab.png"))
        browser.close()
    return seen, blocked, js_errors, log


def test_every_cell_of_chapter_00_runs_in_the_books_kernel(run_all):
    seen, _, js_errors, log = run_all
    assert seen["errors"] == [], f"a cell failed:\n{seen['errors'][0]}"
    assert [p for p in seen["prompts"] if not p[1:-2].isdigit()] == [], f"cells left unrun: {seen['prompts']}\n{log.read_text()[-2000:]}"
    assert len(seen["prompts"]) == sum(c["cell_type"] == "code" for c in json.loads(CHAPTER.read_text())["cells"]) + 1
    assert js_errors == []


def test_known_output_figures_and_a_progress_line_appear(run_all):
    seen = run_all[0]
    assert KNOWN_OUTPUT in seen["text"]
    assert re.search(r"a long loop █+ 3/3 · \d+ s", seen["text"])  # a reader's session shows progress
    assert len(seen["decoded"]) == stored_figures(CHAPTER) > 0 and all(seen["decoded"])


def test_nothing_is_fetched_from_outside(run_all, served):
    assert run_all[1] <= ALLOWED_BLOCKED  # the Colab badge only, which the page does not need
    base, _ = served
    for api, empty in (("news", {"news": []}), ("update", {"notification": None})):  # the server's own fetches
        with urllib.request.urlopen(f"{base}/lab/api/{api}?token={TOKEN}", timeout=10) as answer:
            assert json.load(answer) == empty


def test_a_taken_port_moves_to_the_next_free_one_and_says_so(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert lab.choose_port(port) != port
    assert f"Port {port} is taken" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--port must be between 1 and 65535, got 0"):
        lab.choose_port(0)


def test_make_lab_names_a_python_that_is_too_old(tmp_path):
    """The Makefile checks the Python it will build .venv with (here one that reports 3.9.18)."""
    old = tmp_path / "python3.9"
    old.write_text(f"#!{sys.executable}\nimport sys\nsys.version_info = (3, 9, 18, 'final', 0)\n"
                   "sys.version = '3.9.18 (main)'\ncode, sys.argv = sys.argv[2], ['-c', *sys.argv[3:]]\nexec(code)\n")
    old.chmod(0o755)
    make = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "lab", f"PYTHON={old}", f"VENV={tmp_path / 'venv'}"],
                          capture_output=True, text=True, timeout=60)
    assert make.returncode != 0 and not (tmp_path / "venv").exists()
    assert f"Python 3.10 or newer is needed, and {old} is Python 3.9.18: run make PYTHON=python3.x" in make.stderr


def test_working_copies_follow_the_chapters_but_never_overwrite_the_readers_work(tmp_path):
    source, copies = tmp_path / "book" / "notebooks", tmp_path / "copies"
    source.mkdir(parents=True)
    (source.parent / "benchmarks").mkdir()
    for name in ("01_a", "02_b"):
        (source / f"{name}.ipynb").write_text(f"{name}, first edition")
    assert lab.working_copies(copies, source) == []
    a, b = (copies / "notebooks" / f"{name}.ipynb" for name in ("01_a", "02_b"))
    assert a.read_text() == "01_a, first edition" and (copies / "benchmarks").resolve() == source.parent / "benchmarks"
    assert not Path(os.readlink(copies / "benchmarks")).is_absolute()  # the link survives moving the clone
    b.write_text("the reader's work")
    for name in ("01_a", "02_b"):  # as after a git pull
        (source / f"{name}.ipynb").write_text(f"{name}, second edition")
    notice = (f"notebooks/02_b.ipynb has changed, and so has your copy {b}: rename the copy "
              "(e.g. to 02_b.mine.ipynb) to keep it and get the new version.")
    assert lab.working_copies(copies, source) == [notice] == lab.working_copies(copies, source)
    assert a.read_text() == "01_a, second edition" and b.read_text() == "the reader's work"
    b.rename(b.with_name("02_b.mine.ipynb"))
    assert lab.working_copies(copies, source) == [] and b.read_text() == "02_b, second edition"


def test_the_default_copies_are_ignored_by_git():
    copy = (lab.COPIES / "notebooks" / CHAPTER.name).relative_to(ROOT)
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", str(copy)])
    assert ignored.returncode == 0


def test_the_lab_command_asks_nothing_of_the_internet():
    command = lab.lab_command(ROOT / "notebooks", 8888, "t", browser=False)
    assert {"--LabApp.news_url=None", "--ServerApp.port_retries=0", "--no-browser"} <= set(command)
    config = json.loads((lab.CONFIG / "labconfig" / "page_config.json").read_text())
    assert config["disabledExtensions"] == {"@jupyterlab/apputils-extension:announcements": True}
    assert str(lab.CONFIG) in lab.lab_environment()["JUPYTER_CONFIG_PATH"].split(os.pathsep)
