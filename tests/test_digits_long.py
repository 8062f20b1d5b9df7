"""benchmarks/digits_long.py, chapter 05's digits runs for 20 epochs over a wider rate grid, in a
smoke size; and lnbook.cell_study.stored_digits_long, which reads the stored full run."""

import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lnbook import cell_study

ROOT = Path(__file__).resolve().parents[1]
WIDE, NARROW = (0.001, 0.003, 0.01, 0.03, 0.1), (0.003, 0.01, 0.03)
LSTMS, GRUS = ("LSTM", "BN-LSTM", "LN-LSTM"), ("GRU", "BN-GRU", "LN-GRU")
GRID = {**{("sequential", a): WIDE for a in LSTMS}, **{("permuted", a): WIDE for a in LSTMS},
        **{("sequential", a): NARROW for a in GRUS}}
KEYS = {(*p, lr) for p, lrs in GRID.items() for lr in lrs}


def read(path: Path) -> tuple[list[str], list[list[str]]]:
    lines = path.read_text().splitlines()
    head = [line for line in lines if line.startswith("# ")]
    return head, [line.split(",") for line in lines[len(head):]]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("digits_long")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "digits_long.py"), "--epochs", "2", "--seeds", "2", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    return out


def test_smoke_run_writes_both_files_with_provenance(smoke):
    head, curves = read(smoke / "digits_long-curves.csv")
    for key in ("machine", "commit", "date", "command", "versions"):
        assert any(line.startswith(f"# {key}: ") for line in head), key
    assert any("2 epochs" in line and "seeds 0-1" in line for line in head)
    assert curves[0] == ["task", "arm", "lr", "seed", "epoch", "val_acc"]
    assert len(curves) - 1 == len(KEYS) * 2 * 2  # (task, arm, rate) x seeds x epochs
    assert {(r[0], r[1], float(r[2])) for r in curves[1:]} == KEYS
    assert {int(r[4]) for r in curves[1:]} == {1, 2} and {int(r[3]) for r in curves[1:]} == {0, 1}
    assert all(0 <= float(r[5]) <= 1 for r in curves[1:])
    final_head, final = read(smoke / "digits_long-final.csv")
    assert final_head == head
    assert final[0] == ["task", "arm", "lr", "seed", "val_acc", "test_acc", "val_acc_population", "test_acc_population",
                        "updates_to_1"]
    assert len(final) - 1 == len(KEYS) * 2
    last = {tuple(r[:4]): float(r[5]) for r in curves[1:] if r[4] == "2"}
    for r in final[1:]:
        assert all(0 <= float(v) <= 1 for v in r[4:6])
        assert float(r[4]) == last[tuple(r[:4])]  # the final validation score is the last epoch's, in the same mode
        if r[1].startswith("BN-"):
            assert all(0 <= float(v) <= 1 for v in r[6:8])
        else:
            assert r[6:8] == ["", ""]
        assert r[8] == "" or 10 <= int(r[8]) <= 2 * 18  # 18 updates an epoch; a 10-update mean


def test_the_reader_reads_the_smoke_run(smoke):
    run = cell_study.stored_digits_long(smoke)
    assert run.epochs == [1, 2]
    assert {p: run.lrs[p] for p in run.lrs} == {p: list(lrs) for p, lrs in GRID.items()}
    assert all(s == [0, 1] for s in run.seeds.values()) and set(run.seeds) == set(GRID)
    assert set(run.val) == set(run.test) == set(run.curves) == set(run.updates_to_1) == KEYS
    assert set(run.val_population) == set(run.test_population) == {k for k in KEYS if k[1].startswith("BN-")}
    assert all(c.shape == (2, 2) and np.isfinite(c).all() for c in run.curves.values())
    _, final = read(smoke / "digits_long-final.csv")
    row = next(r for r in final[1:] if r[:4] == ["permuted", "BN-LSTM", "0.01", "1"])
    assert run.test_population["permuted", "BN-LSTM", 0.01][1] == float(row[7])
    assert run.val["permuted", "BN-LSTM", 0.01][1] == float(row[4])
    assert run.updates_to_1["permuted", "BN-LSTM", 0.01][1] == (int(row[8]) if row[8] else None)


def test_the_reader_names_a_missing_or_malformed_file(smoke, tmp_path):
    with pytest.raises(FileNotFoundError, match="digits_long-curves.csv is missing: benchmarks/digits_long.py"):
        cell_study.stored_digits_long(tmp_path)
    for name in ("digits_long-curves.csv", "digits_long-final.csv"):
        shutil.copy(smoke / name, tmp_path / name)
    final = tmp_path / "digits_long-final.csv"
    text = final.read_text()
    final.write_text(text.replace("updates_to_1", "updates"))
    with pytest.raises(ValueError, match="malformed.*columns"):
        cell_study.stored_digits_long(tmp_path)
    lines = text.splitlines()
    final.write_text("\n".join(lines[:-1]) + "\n")  # one (task, arm, rate, seed) fewer
    with pytest.raises(ValueError, match="one row per task, arm, rate and seed"):
        cell_study.stored_digits_long(tmp_path)
    cells = lines[-1].split(",")
    final.write_text("\n".join(lines[:-1] + [",".join(cells[:5] + ["1.5"] + cells[6:])]) + "\n")
    with pytest.raises(ValueError, match="test_acc.*an accuracy of 1.5"):
        cell_study.stored_digits_long(tmp_path)
    final.write_text("\n".join(lines[:-1] + [",".join(cells[:8] + ["-3"])]) + "\n")
    with pytest.raises(ValueError, match="updates_to_1.*'-3'"):
        cell_study.stored_digits_long(tmp_path)
    final.write_text("\n".join(lines[:-1] + [",".join(["sideways", *cells[1:]])]) + "\n")
    with pytest.raises(ValueError, match="task, arm.*sideways"):
        cell_study.stored_digits_long(tmp_path)


def test_stored_results_cover_the_full_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # read from the installed package, not from a path relative to notebooks/
    run = cell_study.stored_digits_long()
    assert any("20 epochs" in line and "seeds 0-9" in line for line in run.provenance)
    assert any(line.startswith("commit: ") for line in run.provenance)
    assert run.epochs == list(range(1, 21))
    assert {p: run.lrs[p] for p in run.lrs} == {p: list(lrs) for p, lrs in GRID.items()}
    assert run.seeds == {p: list(range(10 if p in {("sequential", a) for a in LSTMS} else 5)) for p in GRID}
    assert set(run.val) == set(run.test) == set(run.curves) == set(run.updates_to_1) == KEYS
    assert set(run.val_population) == set(run.test_population) == {k for k in KEYS if k[1].startswith("BN-")}
    for key in KEYS:
        s = len(run.seeds[key[:2]])
        assert run.curves[key].shape == (s, 20) and len(run.updates_to_1[key]) == s
        for scores in (run.val, run.test, run.val_population, run.test_population):
            if key in scores:
                finite = scores[key][np.isfinite(scores[key])]
                assert scores[key].shape == (s,) and ((0.1 < finite) & (finite <= 1)).all()
        assert not math.isnan(np.nanmax(run.test[key]))  # not every seed diverged
