"""benchmarks/depth_sweep.py, the run behind chapter 01's depth verdicts, in a smoke size."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_run_writes_every_setting_with_provenance(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "depth_sweep.py"), "--depths", "2", "4", "--epochs", "1",
           "--seeds", "2", "--lrs", "0.01", "0.1", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    lines = (tmp_path / "depth_sweep.csv").read_text().splitlines()
    head = [line for line in lines if line.startswith("# ")]
    assert any(line.startswith("# command: ") for line in head) and any(line.startswith("# commit: ") for line in head)
    rows = [line.split(",") for line in lines[len(head):]]
    assert rows[0] == ["depth", "arm", "lr", "seed", "val_acc", "updates_to_0.5", "last_loss", "init_grad", "right"]
    # 2 depths x 4 arms x 2 rates x 2 seeds
    assert len(rows) - 1 == 32
    assert {(r[0], r[1]) for r in rows[1:]} == {(d, a) for d in ("2", "4") for a in ("none", "none_he", "batch", "layer")}
    for r in rows[1:]:
        assert 0 <= float(r[4]) <= 1 and (r[5] == "" or int(r[5]) > 0)
        assert len(r[7].split(";")) == int(r[0]) + 1  # a gradient norm per linear layer: the hidden ones and the output
        assert set(r[8]) <= {"0", "1"} and len(r[8]) == 360


def test_stored_sweep_covers_every_setting(tmp_path, monkeypatch):
    from lnbook import batchnorm_study as study

    monkeypatch.chdir(tmp_path)  # read from the installed package, not from a path relative to notebooks/
    sweep = study.stored_depth_sweep()
    assert any(line.startswith("commit: ") for line in sweep.provenance) and sweep.seeds == list(range(10))
    assert sweep.depths == [3, 10, 20] and 0.003 in sweep.lrs and 1.0 in sweep.lrs
    for depth in sweep.depths:
        for arm in ("none", "none_he", "batch", "layer"):
            assert sweep.init_grad[depth, arm].shape == (10, depth + 1) and (sweep.init_grad[depth, arm] > 0).all()
            for lr in sweep.lrs:
                assert sweep.right[depth, arm, lr].shape == (10, 360) and len(sweep.updates[depth, arm, lr]) == 10
                assert ((0 <= sweep.val[depth, arm, lr]) & (sweep.val[depth, arm, lr] <= 1)).all()
