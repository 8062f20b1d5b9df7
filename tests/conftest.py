import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the book's tools, which tests check


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random state."""
    torch.manual_seed(0)
    np.random.seed(0)


@pytest.fixture
def one_thread():
    """Small matrices: one thread is several times faster beside another test process
    (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class FakeClock:
    """Stands in for ``time.perf_counter``: each reading moves it on by ``tick`` seconds, and
    ``advance(s)`` by ``s`` more, so that code under test measures exact times, whatever the
    machine's load. Tests that take the ``fake_clock`` fixture may assert on times
    (``tools/timing_asserts.py``); no other test may."""

    def __init__(self, tick: float = 1.0) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_clock(monkeypatch) -> FakeClock:
    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock
