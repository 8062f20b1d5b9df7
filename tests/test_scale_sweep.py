"""benchmarks/scale_sweep.py, the runs behind chapter 07's verdicts, in a smoke size; and
lnbook.scale_study: the learning-rate sensitivity, the stream's RMS per block, and the reader of
the stored full run."""

import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lnbook import data, scale_study
from lnbook.transformer import GPTConfig, TinyGPT

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("scale_sweep")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "scale_sweep.py"), "--studies", "sweep", "zloss", "--steps", "4",
           "--every", "2", "--every-val", "4", "--seeds", "2", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    return out


def test_smoke_run_writes_both_files_with_provenance_and_every_arm(smoke):
    top = math.log(data.char_corpus().vocab_size) + 1.5  # a few steps from uniform predictions: near log(vocab)
    run = scale_study.stored_scale_sweep(smoke)
    for key in ("machine", "commit", "date", "command", "versions"):
        assert any(line.startswith(f"{key}: ") for line in run.provenance), key
    assert any("4 steps" in line and "seeds 0-1" in line and "beta2 0.95" in line for line in run.provenance)
    assert run.seeds == [0, 1] and set(run.cells) == {"sweep", "zloss"} and run.steps["sweep"] == [2, 4]
    assert run.lrs("sweep") == [0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3] and len(run.arms("sweep")) == 7
    assert run.arms("zloss") == ["Pre-LN + z-loss 0.0001", "Pre-LN + z-loss 0.01"] and run.widths("sweep", "Pre-LN") == [64]
    for cell in run.cells["sweep"]:
        loss = run.final["test_loss"][cell]
        assert (0 < loss).all() and (cell[3] > 0.01 or (loss < top).all()), cell  # four steps at 0.1 or more may overshoot
        assert (run.final["entropy"][cell] >= 0).all() and (run.final["entropy"][cell] <= math.log(32)).all()
        assert np.isfinite(run.final["logit_max_first"][cell]).all() and run.stream[cell].shape == (2, 3)
        curves = run.curves
        assert np.isnan(curves["val_loss"][cell][:, 0]).all() and np.isfinite(curves["val_loss"][cell][:, 1]).all()
        assert all(np.isfinite(curves[name][cell]).all() for name in ("train_loss", "logit_max", "entropy", "log_z"))
    assert run.grid("test_loss", "sweep", "Pre-LN", 64).shape == (7, 2)


def test_the_reader_rejects_missing_and_malformed_files(smoke, tmp_path):
    with pytest.raises(FileNotFoundError, match="benchmarks/scale_sweep.py writes it"):
        scale_study.stored_scale_sweep(tmp_path)
    for name in ("scale_sweep-curves.csv", "scale_sweep-final.csv"):
        shutil.copy(smoke / name, tmp_path / name)
    final = tmp_path / "scale_sweep-final.csv"
    lines = final.read_text().splitlines()
    final.write_text("\n".join(lines[:-1]) + "\n")  # the last seed of the last cell is gone
    with pytest.raises(ValueError, match="every seed"):
        scale_study.stored_scale_sweep(tmp_path)
    final.write_text("\n".join(lines + [lines[-1].replace("zloss,", "cells,", 1)]) + "\n")
    with pytest.raises(ValueError, match="studies must be among"):
        scale_study.stored_scale_sweep(tmp_path)
    final.write_text("\n".join(lines) + "\n")
    curves = tmp_path / "scale_sweep-curves.csv"
    rows = curves.read_text().splitlines()
    curves.write_text("\n".join(rows + [rows[-1].replace(",64,", ",96,", 1)]) + "\n")  # a width that never finished
    with pytest.raises(ValueError, match="runs that scale_sweep-final.csv does not"):
        scale_study.stored_scale_sweep(tmp_path)


def test_the_stored_full_run_is_complete():
    run = scale_study.stored_scale_sweep()
    assert run.seeds == [0, 1, 2, 3, 4] and set(run.cells) == set(scale_study.SCALE_STUDIES)
    assert run.widths("scale", "Pre-LN") == [32, 128, 256] and run.lrs("depth") == [0.0003, 0.001, 0.003, 0.01]
    assert {"Sandwich-LN", "NormFormer", "DeepNorm alpha only", "DeepNorm beta only"} <= set(run.arms("depth"))
    assert run.steps["sweep"][-1] == 300 and all(s.shape == (5, 25) for c, s in run.stream.items() if c[0] == "depth")


def test_lr_sensitivity_is_the_mean_capped_loss_above_the_best():
    losses = np.array([[2.0, 3.0], [1.0, 2.5], [9.0, np.nan]])  # (rates, seeds); the last rate diverged
    assert scale_study.lr_sensitivity(losses, ceiling=4.0) == pytest.approx([(2 + 1 + 4) / 3 - 1, (3 + 2.5 + 4) / 3 - 2.5])
    assert scale_study.lr_sensitivity(np.ones((3, 2)), ceiling=4.0) == pytest.approx([0, 0])
    with pytest.raises(ValueError, match=r"\(rates, seeds\)"):
        scale_study.lr_sensitivity(np.ones(3), ceiling=4.0)
    with pytest.raises(ValueError, match="ceiling must be a finite number"):
        scale_study.lr_sensitivity(np.ones((3, 2)), ceiling=math.inf)


def test_stream_rms_reads_every_block_and_the_heads_input():
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(11, 8, n_layer=3, n_head=2, d_model=16, init="xavier"))
    idx = torch.randint(11, (4, 8))
    rms = scale_study.stream_rms(model, idx)
    x = model.tok(idx) + model.pos(torch.arange(8))
    expected = []
    for block in model.blocks:
        x = block(x)
        expected.append(x.pow(2).mean().sqrt().item())
    expected.append(model.norm_f(x).pow(2).mean().sqrt().item())
    assert rms == pytest.approx(expected, rel=1e-5) and model.training
    with pytest.raises(TypeError, match="model must be a TinyGPT"):
        scale_study.stream_rms(torch.nn.Linear(2, 2), idx)
