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
