"""benchmarks/norm_sweep.py, the run behind chapter 09's section 5 verdicts, in a smoke size, read
back by lnbook.beyond_study.stored_norm_sweep."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lnbook import beyond_study

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_run_is_read_back_complete_with_provenance(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "norm_sweep.py"), "--arms", "none", "batch", "--mlp-epochs", "2",
           "--lstm-epochs", "1", "--seeds", "2", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600, env={"PYTHONPATH": str(ROOT / "src")})
    sweep = beyond_study.stored_norm_sweep(tmp_path)
    assert any(line.startswith("commit: ") for line in sweep.provenance)
    assert any(line.startswith("command: ") for line in sweep.provenance)
    assert sweep.seeds == [0, 1] and sweep.arms == {"lstm": ["none", "batch"], "mlp": ["none", "batch"]}
    assert sweep.epochs == {"lstm": 1, "mlp": 2} and sweep.per_epoch == {"lstm": 18, "mlp": 18}
    assert sweep.lrs == {n: list(beyond_study.SWEEP_RATES[n]) for n in ("lstm", "mlp")}
    for key in sweep.val:
        assert sweep.val[key].shape == sweep.test[key].shape == sweep.loss[key].shape == (2, sweep.epochs[key[0]])
        assert ((sweep.test[key] >= 0) & (sweep.test[key] <= 1)).all()
    rates, test, reached = sweep.select("mlp", 2)
    for arm, lr in rates.items():
        assert sweep.val["mlp", arm, lr][:, 1].mean() == max(sweep.val["mlp", arm, r][:, 1].mean() for r in sweep.lrs["mlp"])
        np.testing.assert_array_equal(test[arm], sweep.test["mlp", arm, lr][:, 1])
        assert (reached[arm] <= 36).all()  # never past the budget of 2 epochs of 18 updates
    assert set(sweep.at_edge("mlp", 2)) <= {"none", "batch"}
    with pytest.raises(ValueError, match="epoch"):
        sweep.select("mlp", 3)
    (tmp_path / "norm_sweep-final.csv").write_text("\n".join((tmp_path / "norm_sweep-final.csv").read_text().splitlines()[:-1]))
    with pytest.raises(ValueError, match="every"):
        beyond_study.stored_norm_sweep(tmp_path)


def test_shipped_sweep_holds_the_grid_of_sweep_rates():
    sweep = beyond_study.stored_norm_sweep()
    assert sweep.lrs == {n: list(beyond_study.SWEEP_RATES[n]) for n in ("lstm", "mlp")}
    assert sweep.seeds == list(range(10)) and sweep.epochs == {"lstm": 12, "mlp": 20}
