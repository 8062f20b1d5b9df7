"""benchmarks/sigmoid_full.py, the run behind chapter 01's 50,000-update verdict, in a smoke size."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

from lnbook import batchnorm_study as study

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


def test_stored_results_cover_the_full_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # read from the installed package, not from a path relative to notebooks/
    run = study.stored_sigmoid_run()
    assert any("50000 updates" in line for line in run.provenance) and run.seeds == list(range(10))
    assert set(run.right) == {("none", 0.3), ("batch", 0.03), ("batch", 0.1)}
    for key, right in run.right.items():
        assert right.shape == (10, 360) and set(np.unique(right)) <= {0.0, 1.0}
        assert max(run.val[key]) == 50_000 and list(run.val[key]) == list(run.loss[key])
        assert all(v.shape == (10,) and ((0 <= v) & (v <= 1)).all() for v in run.val[key].values())


def test_the_wheel_ships_the_stored_results(tmp_path):
    # Colab installs lnbook from git: the stored run must be inside the built package, not only in the checkout
    source = tmp_path / "source"  # a copy, so that the build leaves nothing in the checkout
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
                    str(source)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = tmp_path.glob("lnbook-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"lnbook/results/sigmoid_full-curves.csv", "lnbook/results/sigmoid_full-test.csv",
            "lnbook/results/depth_sweep.csv"} <= set(names)
