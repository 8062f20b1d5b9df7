"""benchmarks/sigmoid_full.py, the run behind chapter 01's 50,000-update verdict, in a smoke size."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def read(path: Path) -> tuple[list[str], list[list[str]]]:
    lines = path.read_text().splitlines()
    head = [line for line in lines if line.startswith("# ")]
    return head, [line.split(",") for line in lines[len(head):]]


def test_smoke_run_writes_both_files_with_provenance(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "sigmoid_full.py"), "--updates", "40", "--every", "20",
           "--seeds", "2", "--lr-none", "0.3", "--lr-batch", "0.03", "0.1", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    head, curves = read(tmp_path / "sigmoid_full-curves.csv")
    assert any(line.startswith("# command: ") for line in head) and any(line.startswith("# commit: ") for line in head)
    assert curves[0] == ["arm", "lr", "seed", "update", "val_acc", "train_loss"]
    # 3 (arm, lr) pairs x 2 seeds x 2 evaluations
    assert len(curves) - 1 == 12
    assert {(r[0], r[1]) for r in curves[1:]} == {("none", "0.3"), ("batch", "0.03"), ("batch", "0.1")}
    assert all(0 <= float(r[4]) <= 1 for r in curves[1:])
    _, tests = read(tmp_path / "sigmoid_full-test.csv")
    assert tests[0] == ["arm", "lr", "seed", "right"] and len(tests) - 1 == 6
    assert all(set(r[3]) <= {"0", "1"} and len(r[3]) == 360 for r in tests[1:])


def test_stored_results_cover_the_full_run():
    head, curves = read(ROOT / "benchmarks" / "results" / "sigmoid_full-curves.csv")
    assert any("50000 updates" in line for line in head)
    assert max(int(r[3]) for r in curves[1:]) == 50_000
    _, tests = read(ROOT / "benchmarks" / "results" / "sigmoid_full-test.csv")
    assert {r[0] for r in tests[1:]} == {"none", "batch"} and all(len(r[3]) == 360 for r in tests[1:])
