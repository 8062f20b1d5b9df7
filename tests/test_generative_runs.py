"""benchmarks/generative.py, the stored runs behind chapter 10 (and chapter 09's rows about it),
in a smoke size, and generative.stored_generative, its reader."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lnbook import generative as G

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("generative")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "generative.py"), "--seeds", "2", "--chapter-steps", "2",
           "--paper-steps", "3", "--vae-steps", "2", "--vae-long-steps", "4", "--vae-long-every", "2", "--arms", "LN critic", "conv, BN critic", "--workers", "1",
           "--out", str(out)]
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600, env=env)
    return out


def test_smoke_run_writes_every_arm_with_provenance(smoke):
    lines = (smoke / "generative-gan.csv").read_text().splitlines()
    head = [line for line in lines if line.startswith("# ")]
    assert any(line.startswith("# command: ") for line in head) and any(line.startswith("# commit: ") for line in head)
    stored = G.stored_generative(str(smoke))
    assert stored.seeds == [0, 1] and sorted(stored.vae) == sorted(G.NORMS)
    assert set(stored.gan) == {(s, a) for s in ("chapter", "paper") for a in ("LN critic", "conv, BN critic")}
    assert list(stored.gan[("paper", "LN critic")]["steps"]) == [3] and stored.gan[("chapter", "LN critic")]["fd"].shape == (2, 1)
    for run in stored.gan.values():
        assert np.all(run["fd"] > 0) and np.all((run["classes"] >= 1) & (run["classes"] <= 10))
    assert np.all(np.concatenate(list(stored.vae.values())) < 0)
    assert sorted(stored.vae_long) == sorted(G.NORMS)
    for run in stored.vae_long.values():
        assert list(run["steps"]) == [2, 4] and run["heldout"].shape == (2, 2) and np.all(run["heldout"] < 0)
        assert all(run[m].shape == (2,) for m in ("train_objective", "train_eval", "heldout_batch"))
    assert sorted(stored.vae_rates) == sorted(G.NORMS)
    for by_rate in stored.vae_rates.values():
        assert sorted(by_rate) == sorted(G.VAE_RATES)
        for run in by_rate.values():
            assert list(run["steps"]) == [2, 4] and run["validation"].shape == run["test"].shape == (2, 2)
            assert np.all(run["validation"] < 0) and np.all(run["test"] < 0)
            assert run["train_objective"].shape == run["train_eval"].shape == (2,)
    # different rates train different models: the validation ELBOs differ
    assert not np.allclose(stored.vae_rates["layer"][G.VAE_RATES[0]]["validation"], stored.vae_rates["layer"][G.VAE_RATES[-1]]["validation"])
    with pytest.raises(ValueError, match="no stored run"):
        stored.final_fd("BN critic")


def test_stored_runs_reproduce_a_live_run_of_the_chapters_configuration(smoke):
    # the reader's numbers are the ones generative.train_arm computes in this process
    torch.set_num_threads(1)
    from lnbook import data

    (train_x, train_y), (test_x, test_y) = data.digits_sequences(order="row")
    judge = G.digits_judge((train_x.flatten(1), train_y), (test_x.flatten(1), test_y))
    _, _, h = G.train_arm(G.GAN_ARMS["LN critic"], [0, 1], train_x.flatten(1) * 2 - 1, judge, G.CHAPTER_GAN | {"steps": 2})
    np.testing.assert_allclose(h.evals["fd"][:, -1], G.stored_generative(str(smoke)).final_fd("LN critic"), rtol=1e-6)


def test_incomplete_files_are_refused(smoke, tmp_path):
    lines = (smoke / "generative-gan.csv").read_text().splitlines()
    (tmp_path / "generative-gan.csv").write_text("\n".join(lines[:-1]) + "\n")
    (tmp_path / "generative-vae.csv").write_text((smoke / "generative-vae.csv").read_text())
    with pytest.raises(ValueError, match="incomplete"):
        G.stored_generative(str(tmp_path))
    (tmp_path / "generative-gan.csv").write_text((smoke / "generative-gan.csv").read_text())
    lines = (smoke / "generative-vae-long.csv").read_text().splitlines()
    (tmp_path / "generative-vae-long.csv").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ValueError, match="incomplete"):
        G.stored_generative(str(tmp_path))
    (tmp_path / "generative-vae-long.csv").write_text((smoke / "generative-vae-long.csv").read_text())
    lines = (smoke / "generative-vae-rates.csv").read_text().splitlines()
    (tmp_path / "generative-vae-rates.csv").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ValueError, match="rate run .* incomplete"):
        G.stored_generative(str(tmp_path))


def test_the_shipped_results_cover_every_arm_of_both_studies():
    stored = G.stored_generative()
    assert stored.seeds == [0, 1, 2, 3, 4]
    from importlib import util
    spec = util.spec_from_file_location("generative_bench", ROOT / "benchmarks" / "generative.py")
    assert spec is not None
    paper_arms = [line.strip().strip('",[]') for line in (ROOT / "benchmarks" / "generative.py").read_text().split("PAPER_ARMS = [")[1]
                  .split("]")[0].replace('",', '"\n').splitlines() if line.strip().strip('",[]')]
    assert {a for s, a in stored.gan if s == "chapter"} == set(G.GAN_ARMS)
    assert {a for s, a in stored.gan if s == "paper"} == set(paper_arms)
    assert list(stored.gan[("chapter", "LN critic")]["steps"]) == list(range(15, 151, 15))
    assert list(stored.gan[("paper", "LN critic")]["steps"]) == list(range(100, 1001, 100))
    assert all(v.shape == (5,) for v in stored.vae.values())
    assert sorted(stored.vae_long) == sorted(G.NORMS)
    for run in stored.vae_long.values():
        assert list(run["steps"]) == list(range(G.LONG_VAE["every"], G.LONG_VAE["steps"] + 1, G.LONG_VAE["every"]))
        assert run["heldout"].shape == (5, len(run["steps"])) and run["train_eval"].shape == (5,)
    assert sorted(stored.vae_rates) == sorted(G.NORMS)
    for by_rate in stored.vae_rates.values():
        assert sorted(by_rate) == sorted(G.VAE_RATES)
        for run in by_rate.values():
            assert list(run["steps"]) == list(range(G.LONG_VAE["every"], G.LONG_VAE["steps"] + 1, G.LONG_VAE["every"]))
            assert run["validation"].shape == run["test"].shape == (5, len(run["steps"]))


def test_the_long_vae_run_passes_through_the_chapters_vaes():
    # the same recipe, seeds and batches; its checkpoint at the chapter's 800 steps is the chapter's stored VAE
    stored = G.stored_generative()
    for norm, run in stored.vae_long.items():
        at = list(run["steps"]).index(G.CHAPTER_VAE["steps"])
        np.testing.assert_allclose(run["heldout"][:, at], stored.vae[norm], rtol=1e-6)
