"""benchmarks/tiny_gpt.py, the runs behind chapter 06's verdicts, in a smoke size; and
lnbook.transformer_study.stored_tiny_gpt, which reads the stored full run."""

import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lnbook import data, transformer_study

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ("norms", "batchnorm")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny_gpt")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "tiny_gpt.py"), "--studies", *STUDIES, "--steps", "4", "--every", "2",
           "--seeds", "2", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    return out


def test_smoke_run_writes_both_files_with_provenance_and_every_arm(smoke):
    top = math.log(data.char_corpus().vocab_size) + 1.5  # a few steps from uniform predictions: near log(vocab)
    run = transformer_study.stored_tiny_gpt(smoke)
    for key in ("machine", "commit", "date", "command", "versions"):
        assert any(line.startswith(f"{key}: ") for line in run.provenance), key
    assert any("4 steps" in line and "seeds 0-1" in line for line in run.provenance)
    assert run.seeds == [0, 1] and set(run.arms) == set(STUDIES)
    assert run.lrs["norms"] == [0.001, 0.003, 0.01] and run.steps["norms"] == [2, 4]
    assert len(run.arms["norms"]) == 12 and run.arms["batchnorm"] == ["BatchNorm"]
    for key, loss in run.test.items():
        assert ((0 < loss) & (loss < top)).all(), key
        assert run.curves[key].shape == (2, 2) and np.isfinite(run.curves[key]).all()
        dyt_final = "DyT final" in key[1] or (key[1].startswith("DyT") and "final" not in key[1]) or "DyT recipe" in key[1]
        assert np.isfinite(run.final_alpha[key]).all() == dyt_final, key
        assert np.isfinite(run.test_batch[key]).all() == (key[0] == "batchnorm")
        assert (run.stream_std[key] > 0).all()
    bn = ("batchnorm", "BatchNorm", 0.003)
    assert np.isfinite(run.test_population[bn]).all() and not np.allclose(run.test_population[bn], run.test[bn])


def test_the_reader_rejects_missing_and_malformed_files(smoke, tmp_path):
    with pytest.raises(FileNotFoundError, match="benchmarks/tiny_gpt.py writes it"):
        transformer_study.stored_tiny_gpt(tmp_path)
    for name in ("tiny_gpt-curves.csv", "tiny_gpt-final.csv"):
        shutil.copy(smoke / name, tmp_path / name)
    final = tmp_path / "tiny_gpt-final.csv"
    lines = final.read_text().splitlines()
    final.write_text("\n".join(lines[:-1]) + "\n")  # the last seed of the last arm is gone
    with pytest.raises(ValueError, match="runs that tiny_gpt-final.csv does not"):
        transformer_study.stored_tiny_gpt(tmp_path)
    final.write_text("\n".join(lines + [lines[-1].replace(",BatchNorm,", ",GroupNorm,", 1)]) + "\n")
    with pytest.raises(ValueError, match="every seed"):
        transformer_study.stored_tiny_gpt(tmp_path)
    final.write_text("\n".join(lines[:-1] + [lines[-1].replace("batchnorm", "vision", 1)]) + "\n")
    with pytest.raises(ValueError, match="studies must be among"):
        transformer_study.stored_tiny_gpt(tmp_path)
    cells = lines[-1].split(",")
    final.write_text("\n".join(lines[:-1] + [",".join(cells[:4] + ["loss"] + cells[5:])]) + "\n")
    with pytest.raises(ValueError, match="expected a number"):
        transformer_study.stored_tiny_gpt(tmp_path)


def test_the_shipped_run_is_complete():
    run = transformer_study.stored_tiny_gpt()
    assert len(run.seeds) == 10 and set(run.arms) == set(transformer_study.TINY_GPT_STUDIES)
    assert run.steps["norms"][-1] == 300 and len(run.arms["warmup"]) == 10 and len(run.arms["mlm"]) == 3
    assert all(v.shape == (10,) for v in run.test.values())
