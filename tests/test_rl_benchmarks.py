"""benchmarks/dqn_rl.py and benchmarks/plasticity.py, the stored runs behind chapter 09's DQN and
plasticity verdicts, in a smoke size, read back by their readers; and the stored runs themselves."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lnbook import rl

ROOT = Path(__file__).resolve().parents[1]
ENV = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}


def _run(*args):
    done = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr


def test_dqn_script_runs_small_and_its_reader_reads_it(tmp_path):
    _run(ROOT / "benchmarks" / "dqn_rl.py", "--steps", "120", "--every", "60", "--last-evals", "2", "--val-seeds", "2",
         "--test-seeds", "2", "--lrs", "1e-3", "3e-3", "--arms", "layer:no target network", "--out", tmp_path)
    run = rl.stored_dqn_run(tmp_path)
    assert any("DQN on CartPole" in line for line in run.provenance)
    assert (run.steps, run.every, run.last_evals, run.val_seeds, run.test_seeds) == (120, 60, 2, [100, 101], [0, 1])
    arm = ("layer", "no target network")
    assert set(run.val) == {arm} and set(run.val[arm]) == {1e-3, 3e-3}
    ((key, greedy),) = run.test.items()
    np.testing.assert_allclose(greedy, run.curves["test", *key].mean(1), rtol=1e-4)  # the last 2 of 2 evaluations
    assert ((greedy >= 8) & (greedy <= 500)).all()
    with pytest.raises(FileNotFoundError, match="dqn_rl"):
        rl.stored_dqn_run(tmp_path / "nowhere")
    _run(ROOT / "benchmarks" / "dqn_rl.py", "--steps", "120", "--every", "60", "--last-evals", "2", "--val-seeds", "2",
         "--test-seeds", "0", "--lrs", "1e-2", "--arms", "layer:no target network", "--out", tmp_path / "val_only")
    val_only = rl.stored_dqn_run(tmp_path / "val_only")  # --test-seeds 0: validation only, as a grid's extra rates ran
    assert set(val_only.val[arm]) == {1e-2} and val_only.test == {} and val_only.test_seeds == []


def test_plasticity_script_runs_small_and_its_reader_reads_it(tmp_path):
    _run(ROOT / "benchmarks" / "plasticity.py", "--steps", "5", "--tasks", "2", "--val-seeds", "2", "--test-seeds", "2",
         "--wds", "0.01", "0.1", "--out", tmp_path)
    run = rl.stored_plasticity(tmp_path)
    assert (run.steps, run.tasks, run.val_seeds, run.test_seeds) == (5, 2, [100, 101], [0, 1])
    val = {k for k in run.fit if k[0] == "val"}
    assert len(val) == 2 * 2 * 2 and all(k[4] == "continual" for k in val)  # norms x targets x weight decays
    test = {k for k in run.fit if k[0] == "test"}
    assert len(test) == 2 * 2 * 2 * 2  # norms x targets x (no decay, chosen decay) x (continual, fresh)
    for key in test:
        twin = (*key[:4], "fresh" if key[4] == "continual" else "continual")
        np.testing.assert_allclose(run.fit[key][:, 0], run.fit[twin][:, 0])  # task 1 is the same run in both modes
    assert all(v.shape == (2, 2) for v in run.weight_norm.values())
    lines = (tmp_path / "plasticity-tasks.csv").read_text().splitlines()
    (tmp_path / "plasticity-tasks.csv").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ValueError, match="incomplete"):
        rl.stored_plasticity(tmp_path)


def test_the_stored_runs_are_complete():
    """The committed results chapter 09 reads: every arm at every rate on validation, and on the
    test seeds at the rate chosen there."""
    stream = rl.stored_stream_run()
    assert set(stream.val) == set(rl.STREAM_ARMS) and stream.val_seeds == list(range(100, 105))
    assert all(set(grid) == {0.01, 0.1, 1.0} for grid in stream.val.values())
    assert {arm for arm, _ in stream.test} == set(rl.STREAM_ARMS) and stream.test_seeds == list(range(10))
    for (arm, lr), values in stream.test.items():
        assert lr == max(stream.val[arm], key=lambda r: stream.val[arm][r].mean())  # chosen on validation
        assert ((values >= 8) & (values <= 500)).all()
    dqn = rl.stored_dqn_run()
    assert set(dqn.val) == set(rl.DQN_ARMS) and dqn.test_seeds == list(range(10))
    assert (dqn.steps, dqn.every, dqn.last_evals) == (6000, 500, 4)
    assert any(line.startswith("merged: ") for line in dqn.provenance)
    for arm, grid in dqn.val.items():
        assert set(grid) == {1e-4, 3e-4, 1e-3, 3e-3, 1e-2}
        assert (arm, max(grid, key=lambda r: grid[r].mean())) in dqn.test  # the test seeds ran at the rate chosen on validation
    for (arm, lr), values in dqn.test.items():
        first = {r: v for r, v in dqn.val[arm].items() if r in (3e-4, 1e-3, 3e-3)}  # the first run's grid, its test rows kept
        assert lr in (max(dqn.val[arm], key=lambda r: dqn.val[arm][r].mean()), max(first, key=lambda r: first[r].mean()))
        np.testing.assert_allclose(values, dqn.curves["test", arm, lr][:, -4:].mean(1), rtol=1e-4)


def test_the_stored_plasticity_run_is_complete():
    run = rl.stored_plasticity()
    assert (run.steps, run.tasks, run.val_seeds, run.test_seeds) == (1000, 8, [100, 101, 102], list(range(5)))
    decays = {k[2] for k in run.fit if k[0] == "val"}
    assert decays == {0.01, 0.1}
    for norm in ("none", "layer"):
        for targets in rl.PLASTICITY_TARGETS:
            grid = {d: run.fit["val", norm, d, targets, "continual"].mean() for d in decays}
            chosen = min(grid, key=grid.get)  # chosen on validation: the lowest mean fit over all tasks
            assert {k[2] for k in run.fit if k[0] == "test" and k[1:2] == (norm,) and k[3] == targets} == {0.0, chosen}
            fresh = run.fit["test", norm, 0.0, targets, "fresh"]
            assert fresh[:, 0].mean() < 0.1  # the tasks are long enough that a new network fits the first
    assert all(((v >= 0) & (v <= 1)).all() for v in run.dead.values())
