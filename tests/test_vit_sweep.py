"""benchmarks/vit_sweep.py, the run behind chapter 09's ViT verdicts, in a smoke size, read back by
lnbook.transformer.stored_vit_sweep."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lnbook import transformer

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_run_is_read_back_complete_with_provenance(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "vit_sweep.py"), "--depths", "1", "--steps", "4", "--eval-every", "2",
           "--seeds", "2", "--lrs", "0.003", "0.01", "--norms", "layernorm", "batchnorm", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600, env={"PYTHONPATH": str(ROOT / "src")})
    sweep = transformer.stored_vit_sweep(tmp_path)
    assert any(line.startswith("commit: ") for line in sweep.provenance)
    assert sweep.norms == ["layernorm", "batchnorm"] and sweep.depths == [1] and sweep.lrs == [0.003, 0.01]
    assert sweep.seeds == [0, 1] and sweep.steps == [2, 4]
    for key in sweep.val:
        assert sweep.val_curve[key].shape == (2, 2) and sweep.train_loss[key].shape == (2, 2)
        np.testing.assert_allclose(sweep.val_curve[key][:, -1], sweep.val[key])
        assert ((0 <= sweep.test[key]) & (sweep.test[key] <= 1)).all()
    assert set(sweep.precise) == set(sweep.batch) == {("batchnorm", 1, lr) for lr in sweep.lrs}
    chosen = sweep.select(1)
    for norm in sweep.norms:
        lr = chosen.setting[norm]
        assert sweep.val[norm, 1, lr].mean() == max(sweep.val[norm, 1, r].mean() for r in sweep.lrs)
        np.testing.assert_allclose(chosen.test[norm], sweep.test[norm, 1, lr])
    assert list(sweep.select(1, "precise").test) == ["batchnorm"]
    with pytest.raises(ValueError, match="depth"):
        sweep.select(6)
    lines = (tmp_path / "vit_sweep-final.csv").read_text().splitlines()
    (tmp_path / "vit_sweep-final.csv").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ValueError, match="every seed"):
        transformer.stored_vit_sweep(tmp_path)


def test_stored_sweep_brackets_every_arm_s_best_rate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # read from the installed package, not from a path relative to notebooks/
    sweep = transformer.stored_vit_sweep()
    assert sweep.seeds == list(range(5)) and sweep.depths == [2, 6] and sweep.lrs == [0.003, 0.01, 0.03]
    assert sweep.norms == ["none", "layernorm", "batchnorm"] and sweep.steps[-1] == 176
    for depth in sweep.depths:
        chosen = sweep.select(depth)
        for norm in sweep.norms:  # no arm wants a rate above the grid (the first run, 1e-3 to 1e-2, left no norm and LN at its top)
            assert chosen.setting[norm] < max(sweep.lrs) and not sweep.diverged[norm, depth, chosen.setting[norm]].any()
