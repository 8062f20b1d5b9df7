"""benchmarks/char_lm.py, the run behind chapter 05's language-modelling verdict, in a smoke size;
and lnbook.cell_study.stored_char_lm, which reads the stored full run."""

import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lnbook import cell_study, data

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("LSTM", "LN-LSTM", "BN-LSTM")
LRS = (0.003, 0.01, 0.03)


def read(path: Path) -> tuple[list[str], list[list[str]]]:
    lines = path.read_text().splitlines()
    head = [line for line in lines if line.startswith("# ")]
    return head, [line.split(",") for line in lines[len(head):]]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("char_lm")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "char_lm.py"), "--steps", "4", "--every", "2", "--seeds", "2",
           "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    return out


def test_smoke_run_writes_both_files_with_provenance(smoke):
    top = math.log(data.char_corpus().vocab_size) + 1  # a few steps from uniform predictions: near log(vocab)
    head, curves = read(smoke / "char_lm-curves.csv")
    for key in ("machine", "commit", "date", "command", "versions"):
        assert any(line.startswith(f"# {key}: ") for line in head), key
    assert any("4 steps" in line and "seeds 0-1" in line for line in head)
    assert curves[0] == ["arm", "lr", "seed", "step", "val_loss"]
    assert len(curves) - 1 == 3 * 3 * 2 * 2  # arms x rates x seeds x evaluations
    assert {(r[0], float(r[1])) for r in curves[1:]} == {(a, lr) for a in ARMS for lr in LRS}
    assert {int(r[3]) for r in curves[1:]} == {2, 4}
    assert all(0 < float(r[4]) < top for r in curves[1:])
    final_head, final = read(smoke / "char_lm-final.csv")
    assert final_head == head
    assert final[0] == ["arm", "lr", "seed", "val_loss", "test_loss", "val_loss_population", "test_loss_population"]
    assert len(final) - 1 == 3 * 3 * 2
    for r in final[1:]:
        assert all(0 < float(v) < top for v in r[3:5])
        if r[0] == "BN-LSTM":
            assert all(0 < float(v) < top for v in r[5:])
        else:
            assert r[5:] == ["", ""]


def test_the_reader_reads_the_smoke_run(smoke):
    run = cell_study.stored_char_lm(smoke)
    assert run.seeds == [0, 1] and run.lrs == list(LRS) and run.steps == [2, 4]
    assert set(run.val) == set(run.test) == set(run.curves) == {(a, lr) for a in ARMS for lr in LRS}
    assert set(run.val_population) == set(run.test_population) == {("BN-LSTM", lr) for lr in LRS}
    assert all(c.shape == (2, 2) and np.isfinite(c).all() for c in run.curves.values())
    _, final = read(smoke / "char_lm-final.csv")
    row = next(r for r in final[1:] if r[:3] == ["BN-LSTM", "0.01", "1"])
    assert run.test_population["BN-LSTM", 0.01][1] == float(row[6]) and run.val["BN-LSTM", 0.01][1] == float(row[3])


def test_the_reader_names_a_missing_or_malformed_file(smoke, tmp_path):
    with pytest.raises(FileNotFoundError, match="char_lm-curves.csv is missing"):
        cell_study.stored_char_lm(tmp_path)
    for name in ("char_lm-curves.csv", "char_lm-final.csv"):
        shutil.copy(smoke / name, tmp_path / name)
    final = tmp_path / "char_lm-final.csv"
    text = final.read_text()
    final.write_text(text.replace("test_loss_population", "test_pop"))
    with pytest.raises(ValueError, match="malformed.*columns"):
        cell_study.stored_char_lm(tmp_path)
    lines = text.splitlines()
    final.write_text("\n".join(lines[:-1]) + "\n")  # one (arm, rate, seed) fewer
    with pytest.raises(ValueError, match="one row per arm, rate and seed"):
        cell_study.stored_char_lm(tmp_path)
    final.write_text("\n".join(lines[:-1] + [",".join(lines[-1].split(",")[:3] + ["-1"] + lines[-1].split(",")[4:])]))
    with pytest.raises(ValueError, match="val_loss.*a loss of -1"):
        cell_study.stored_char_lm(tmp_path)


def test_stored_results_cover_the_full_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # read from the installed package, not from a path relative to notebooks/
    run = cell_study.stored_char_lm()
    assert any("300 steps" in line and "seeds 0-9" in line for line in run.provenance)
    assert any(line.startswith("commit: ") for line in run.provenance)
    assert run.seeds == list(range(10)) and run.lrs == list(LRS) and run.steps == [50, 100, 150, 200, 250, 300]
    assert set(run.val) == set(run.test) == set(run.curves) == {(a, lr) for a in ARMS for lr in LRS}
    assert set(run.val_population) == set(run.test_population) == {("BN-LSTM", lr) for lr in LRS}
    top = math.log(data.char_corpus().vocab_size)
    for key in run.val:
        assert run.curves[key].shape == (10, 6) and np.isfinite(run.curves[key]).all()
        for scores in (run.val, run.test, run.val_population, run.test_population):
            if key in scores:
                assert scores[key].shape == (10,) and ((0.5 < scores[key]) & (scores[key] < top)).all()
