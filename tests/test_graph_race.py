"""benchmarks/graph_race.py, the run behind chapter 09's graph verdicts, in a smoke size, read back
by lnbook.graphs.stored_graph_race."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lnbook import graphs

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_run_is_read_back_complete_with_provenance(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "graph_race.py"), "--epochs", "2", "--seeds", "2", "--lrs", "0.003",
           "0.01", "--norms", "none", "instance", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600, env={"PYTHONPATH": str(ROOT / "src")})
    race = graphs.stored_graph_race(tmp_path)
    assert any(line.startswith("commit: ") for line in race.provenance)
    assert any(line.startswith("command: ") for line in race.provenance)
    assert race.seeds == [0, 1] and race.norms == ["none", "instance"] and race.lrs == [0.003, 0.01]
    for key in race.val:
        assert race.train_loss[key].shape == (2, 2) and race.val_curve[key].shape == (2, 2)
        np.testing.assert_allclose(race.val_curve[key][:, -1], race.val[key], rtol=1e-5)
        assert (race.test[key] > 0).all() and (race.large[key] > 0).all()
    assert 0 < race.lookup["test"] < race.variance["test"]  # the lookup is far better than the mean
    chosen = race.select("test")
    for norm in race.norms:
        lr = chosen.setting[norm]
        assert race.val[norm, lr].mean() == min(race.val[norm, r].mean() for r in race.lrs)
        np.testing.assert_allclose(chosen.test[norm], race.test[norm, lr] / race.lookup["test"])
    with pytest.raises(ValueError, match="measure"):
        race.select("val")
    (tmp_path / "graph_race-final.csv").write_text("\n".join((tmp_path / "graph_race-final.csv").read_text().splitlines()[:-1]))
    with pytest.raises(ValueError, match="every"):
        graphs.stored_graph_race(tmp_path)


def test_stored_race_holds_every_norm_rate_and_seed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # read from the installed package, not from a path relative to notebooks/
    race = graphs.stored_graph_race()
    assert race.norms == list(graphs.NORMS) and race.lrs == [0.001, 0.003, 0.01, 0.03] and race.seeds == list(range(5))
    assert any("placement='main'" in line for line in race.provenance)
    assert any(line.startswith("merged: ") for line in race.provenance)  # the 0.03 run, added to the first run's grid
    for key in race.val:
        assert race.train_loss[key].shape == (5, 80) and np.isfinite(race.train_loss[key]).all()
    assert race.lookup["test"] == pytest.approx(0.0046, abs=5e-5)  # the notebook's degree lookup on the same graphs
    chosen = race.select("test")
    assert (chosen.test["none"] < 1).all()  # trained this long, the plain network beats the lookup on every seed
