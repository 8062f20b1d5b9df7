"""lnbook.utils: seeding, show_source, Table and spread."""

import random

import numpy as np
import pytest
import torch

from lnbook import utils
from lnbook.reference import layernorm_forward
from lnbook.utils import seed_everything, show_source


def test_seed_everything_makes_every_generator_repeat():
    def draw():
        return random.random(), np.random.rand(), torch.rand(1).item()

    seed_everything(7)
    first = draw()
    seed_everything(7)
    assert draw() == first
    seed_everything(8)
    assert draw() != first


def test_show_source_shows_the_real_code_highlighted():
    src = show_source(layernorm_forward)
    assert repr(src).startswith("def layernorm_forward(")
    assert "rstd = 1.0 / np.sqrt(var + eps)" in repr(src)
    html = src._repr_html_()
    assert "<span" in html and "layernorm_forward" in html and "<style" not in html


def test_show_source_dedents_methods():
    from lnbook.norms import LayerNorm

    assert repr(show_source(LayerNorm.forward)).startswith("def forward(self")


def test_show_source_shows_a_triton_kernels_python():
    from lnbook.kernels import norm

    code = show_source(norm._forward).code
    assert code.startswith("@triton.jit\ndef _forward(") and "tl.store(Rstd + rows, rstd, mask=row_ok)" in code


def test_table_is_text_for_nbval_and_markdown_for_the_book():
    from lnbook.utils import Table

    t = Table(["norm", "accuracy"], [["BatchNorm", 0.5], ["LayerNorm | x", "0.9"]])
    assert repr(t).splitlines() == [
        "norm          | accuracy",
        "--------------+---------",
        "BatchNorm     | 0.5",
        "LayerNorm | x | 0.9",
    ]
    assert t._repr_markdown_().splitlines()[2:] == ["| BatchNorm | 0.5 |", "| LayerNorm \\| x | 0.9 |"]
    with pytest.raises(ValueError, match=r"rows\[0\] has 1 cells, the header has 2"):
        Table(["a", "b"], [["x"]])


def test_spread_formats_mean_min_max():
    assert utils.spread([0.5, 0.25, 0.75]) == "0.500 [0.250, 0.750]"
    assert utils.spread([30, 29, 31], digits=0) == "30 [29, 31]"
    with pytest.raises(ValueError, match="non-empty 1-D"):
        utils.spread([])


def test_interval_and_ci():
    mean, low, high = utils.interval([1.0, 2.0, 3.0])  # t(0.975, 2) = 4.302653, s / sqrt(3) = 1 / sqrt(3)
    assert mean == 2.0
    np.testing.assert_allclose([low, high], [2.0 - 4.302653 / 3**0.5, 2.0 + 4.302653 / 3**0.5], rtol=1e-6)
    assert utils.ci([0.5, 0.5, 0.5]) == "0.500 [0.500, 0.500]"
    with pytest.raises(ValueError, match="at least 2"):
        utils.interval([1.0])
    with pytest.raises(ValueError, match="level must be"):
        utils.interval([1.0, 2.0], level=95)


def test_stored_number_reads_a_cell_and_refuses_text_and_infinities():
    import math

    from lnbook.utils import stored_number

    assert stored_number("2.5", "lr", "x.py") == 2.5 and math.isnan(stored_number("", "lr", "x.py"))
    assert math.isnan(stored_number("nan", "lr", "x.py"))
    for text, match in (("fast", "expected a number"), ("inf", "expected a finite number or nan")):
        with pytest.raises(ValueError, match=f"benchmarks/x.py holds '{text}' in lr, {match}"):
            stored_number(text, "lr", "x.py")
