"""Progress lines (lnbook.progress): a long helper reports its progress when asked and stays
silent otherwise; in a Jupyter kernel, only one that a Jupyter server started (a reader's) shows
it, so that nbval and the notebooks' stored outputs never contain a bar."""

import re

import nbformat
import pytest
import torch
from nbclient import NotebookClient

from lnbook import progress as progress_module
from lnbook.models import MLP
from lnbook.progress import progress, showing, shown
from lnbook.train import fit

pytestmark = pytest.mark.usefixtures("one_thread")


def digits_like(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 8), torch.randint(0, 3, (n,))


def test_a_long_helper_reports_progress_when_asked(capsys, monkeypatch):
    monkeypatch.delenv("LNBOOK_PROGRESS", raising=False)
    data = digits_like()
    with showing(True):
        fit(MLP(8, [16], 3), data, data, epochs=3, lr=0.1, batch_size=16, seed=0)
    err = capsys.readouterr().err
    assert re.search(r"\repochs █+ 3/3 · \d+ s\x1b\[K\n$", err), err  # ESC [K: the line's old tail cleared


def test_a_long_helper_is_silent_otherwise(capsys, monkeypatch):
    monkeypatch.delenv("LNBOOK_PROGRESS", raising=False)
    data = digits_like()
    fit(MLP(8, [16], 3), data, data, epochs=3, lr=0.1, batch_size=16, seed=0)  # not a Jupyter kernel: silent
    with showing(False):
        monkeypatch.setenv("LNBOOK_PROGRESS", "1")
        fit(MLP(8, [16], 3), data, data, epochs=3, lr=0.1, batch_size=16, seed=0)
    assert capsys.readouterr() == ("", "")


def test_loops_inside_loops_share_one_line(capsys):
    with showing(True):
        for _ in progress(range(2), "runs"):
            for _ in progress(range(4), "epochs"):
                pass
        assert progress_module._active == []
    last = capsys.readouterr().err.split("\r")[-1]
    assert last.startswith("runs ") and " 2/2" in last and "epochs" not in last  # the outer loop's line, finished


def test_the_line_follows_the_loop_at_most_every_quarter_second(capsys, monkeypatch):
    with showing(True):
        monkeypatch.setattr(progress_module, "EVERY", 0.0)
        list(progress(range(3), "steps"))
        assert [line.split(" · ")[0][-3:] for line in capsys.readouterr().err.split("\r")[1:]] == ["0/3", "1/3", "2/3", "3/3", "3/3"]
        monkeypatch.setattr(progress_module, "EVERY", 3600.0)
        list(progress(range(3), "steps"))
        assert [line.split(" · ")[0][-3:] for line in capsys.readouterr().err.split("\r")[1:]] == ["0/3", "3/3"]


def test_the_setting_is_checked(monkeypatch):
    monkeypatch.setenv("LNBOOK_PROGRESS", "yes")
    with pytest.raises(ValueError, match=r"LNBOOK_PROGRESS must be one of \('0', '1'\), got 'yes'"):
        shown()
    monkeypatch.setenv("LNBOOK_PROGRESS", "0")
    assert shown() is False
    with pytest.raises(ValueError, match="total must be a non-negative int, got -1"):
        progress(range(2), "steps", total=-1)
    with pytest.raises(TypeError, match="on must be a bool, got str"):
        with showing("yes"):
            pass


def test_in_a_kernel_only_a_readers_session_shows_a_line(monkeypatch):
    """nbclient starts kernels as nbval does, without JPY_SESSION_NAME: no output. With it, as a
    Jupyter server sets it, one line per outermost loop, kept up to date."""
    monkeypatch.delenv("LNBOOK_PROGRESS", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    loops = "from lnbook.progress import progress\nfor _ in progress(range(3), 'demo'):\n    pass\n"
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(loops),
        nbformat.v4.new_code_cell("import os\nos.environ['JPY_SESSION_NAME'] = 'chapter.ipynb'"),
        nbformat.v4.new_code_cell(loops + "for _ in progress(range(2), 'again'):\n    pass\n"),
        nbformat.v4.new_code_cell("held = progress(range(5), 'held')\nnext(held)"),  # left unfinished
        nbformat.v4.new_code_cell(loops)])
    NotebookClient(nb, kernel_name="python3", timeout=120).execute()
    silent, _, shown_here, _, after_held = (cell.outputs for cell in nb.cells)
    assert silent == []
    assert [out.output_type for out in shown_here] == ["display_data", "display_data"]
    assert [re.sub(r"█+", "█", out.data["text/plain"].split(" · ")[0]) for out in shown_here] == ["demo █ 3/3", "again █ 2/2"]
    assert [re.sub(r"█+", "█", out.data["text/plain"].split(" · ")[0]) for out in after_held] == ["demo █ 3/3"]  # its own line


def test_a_loop_stopped_by_an_exception_leaves_no_trace(capsys):
    def interrupted():
        for i in progress(range(5), "interrupted"):
            if i == 2:
                raise KeyboardInterrupt

    with showing(True):
        with pytest.raises(KeyboardInterrupt):
            interrupted()
        assert progress_module._active == []
        list(progress(range(2), "next"))
    last = capsys.readouterr().err.split("\r")[-1]
    assert last.startswith("next ") and "interrupted" not in last
