"""How every verdict in the book is earned: paired differences over seeds, their intervals and
Holm-adjusted tests, and settings chosen on a validation split.

Each arm of an experiment is a list of per-seed results, aligned by seed: ``results["LN"][i]``
and ``results["BN"][i]`` come from the same seed (the same initial weights where the shapes
allow, the same batches). :func:`compare` takes the per-seed differences, gives each its mean,
its 95% interval and a p-value, adjusts the p-values of one call (one family) with Holm's
method, and writes the verdict: "X beats Y by d [lo, hi]" when the adjusted test rejects,
"no difference measured" with the effects the interval still allows otherwise. One table of
comparisons is one family: a call shown alone is its own table, and :func:`by_measure` shows
several calls as one table and redoes the adjustment over all its rows.
:func:`select` picks each arm's setting from a grid on validation results and returns the test
results at that setting only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ._checks import check_bool, check_choice, check_int, check_number, check_positive_int, describe
from .utils import Table, ci, interval

ALPHA = 0.05  # every verdict of the book: 95% intervals, tests at the 5% level


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjustment of one family's p-values: sort them, multiply the k-th
    smallest of m by (m - k + 1), carry the running maximum, cap at 1. (m,) -> (m,)."""
    p = np.asarray(p_values, dtype=float)
    if p.ndim != 1 or np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"p_values must be a 1-D sequence of numbers in [0, 1], got {describe(p_values)}")
    order = np.argsort(p, kind="stable")
    adjusted = np.maximum.accumulate(p[order] * (len(p) - np.arange(len(p))))
    out = np.empty_like(p)
    out[order] = np.minimum(adjusted, 1.0)
    return out


def _t_test(d: np.ndarray, level: float) -> tuple[float, float, float]:
    """Student t over the values ``d`` (n,): the mean's interval at ``level`` and the two-sided
    p-value of mean 0. Zero spread gives a zero-width interval, and p = 1 only when all are 0."""
    from scipy.stats import t as student_t

    mean, low, high = interval(d, level)
    se = float(d.std(ddof=1)) / math.sqrt(len(d))
    if se == 0:
        return low, high, 1.0 if mean == 0 else 0.0
    return low, high, float(2 * student_t.sf(abs(mean) / se, len(d) - 1))


def _welch(a: np.ndarray, b: np.ndarray, level: float) -> tuple[float, float, float]:
    """Welch's unpaired interval of mean(a) - mean(b) at ``level`` and its two-sided p-value."""
    from scipy.stats import t as student_t

    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    diff, se = float(a.mean() - b.mean()), math.sqrt(va + vb)
    if se == 0:
        return diff, diff, 1.0 if diff == 0 else 0.0
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(student_t.ppf((1 + level) / 2, dof)) * se
    return diff - half, diff + half, float(2 * student_t.sf(abs(diff) / se, dof))


def _bootstrap(d: np.ndarray, level: float, draws: int, seed: int) -> tuple[float, float, float]:
    """The percentile bootstrap interval of the mean of ``d`` (n,), and the bootstrap test of
    mean 0: the share of resampled means of the centred differences at least as far from 0."""
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(draws, len(d)))].mean(1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    centred = means - d.mean()
    p = (1 + np.sum(np.abs(centred) >= abs(d.mean()))) / (draws + 1) if np.ptp(d) > 0 else float(d.mean() == 0)
    return float(low), float(high), float(min(p, 1.0))


@dataclass(frozen=True)
class Comparison:
    """One comparison of arm ``a`` against arm ``b``: ``diff`` is mean(a) - mean(b) (over the
    per-seed differences when ``paired``), ``[low, high]`` its 95% interval, ``p`` the two-sided
    test's p-value and ``p_holm`` the same after Holm's adjustment over the ``family`` of
    comparisons made in one call. ``winner`` names the better arm when the adjusted test rejects
    (the larger one when ``higher`` is None: no side is better), and is None otherwise."""

    a: str
    b: str
    n: int
    diff: float
    low: float
    high: float
    p: float
    p_holm: float
    family: int
    higher: bool | None
    paired: bool
    digits: int
    winner: str | None = None
    diverged: Mapping[str, int] = field(default_factory=dict)

    def _num(self, v: float, sign: bool = True) -> str:
        text = f"{v:+.{self.digits}f}" if sign else f"{v:.{self.digits}f}"
        return text.replace("-", "−")

    @property
    def interval(self) -> str:
        """``"+0.008 [+0.001, +0.015]"``: the difference a - b and its 95% interval."""
        return f"{self._num(self.diff)} [{self._num(self.low)}, {self._num(self.high)}]"

    @property
    def loser(self) -> str | None:
        """The other arm than the winner (None when there is no winner)."""
        return None if self.winner is None else self.b if self.winner == self.a else self.a

    @property
    def short(self) -> str:
        """The verdict alone: ``"X beats Y"`` (``"X > Y"`` when no side is better) or
        ``"no difference measured"``."""
        if self.winner is None:
            return "no difference measured"
        return f"{self.winner} > {self.loser}" if self.higher is None else f"{self.winner} beats {self.loser}"

    @property
    def sentence(self) -> str:
        """The verdict with its numbers. ``"X beats Y by d [lo, hi]"`` (d in the direction that
        is better; ``"X is larger than Y by ..."`` when no side is better); otherwise
        ``"no difference measured: a − b = d [lo, hi]"`` and the largest effect the interval
        still allows."""
        tag = "" if self.paired else " (unpaired)"
        if self.winner is not None:
            s = 1.0 if self.winner == self.a else -1.0  # the winner's side of a − b: +1 for a
            if self.higher is False:
                s = -s
            lo, hi = sorted((s * self.low, s * self.high))
            verb = "is larger than" if self.higher is None else "beats"
            return (f"{self.winner} {verb} {self.loser} by {self._num(s * self.diff, False)} "
                    f"[{self._num(lo, False)}, {self._num(hi, False)}]{tag}")
        allowed = max(abs(self.low), abs(self.high))
        text = (f"no difference measured: {self.a} − {self.b} = {self.interval}{tag}, "
                f"a difference up to {self._num(allowed, False)} not excluded")
        if self.low > 0 or self.high < 0:
            text += f" (the interval excludes 0, but not after Holm's correction for {self.family} comparisons)"
        return text


class Comparisons(Sequence[Comparison]):
    """The comparisons of one call, one family for Holm's adjustment. Index it by position, by
    the pair of names (``result["LN", "BN"]``) or, for a :func:`by_measure` table, by a measure's
    name (its comparisons); it renders as a Markdown table in the book and as aligned text under
    nbval. ``measures`` names each row's measure (a first column headed ``label``)."""

    def __init__(self, rows: Sequence[Comparison], measures: Sequence[str] | None = None, label: str = "measure") -> None:
        self.rows, self.label = list(rows), label
        self.measures = None if measures is None else list(measures)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, str):
            if not self.measures or key not in self.measures:
                raise KeyError(f"no measure {key!r}; measures: {sorted(set(self.measures or []))}")
            return Comparisons([c for c, m in zip(self.rows, self.measures) if m == key])
        if isinstance(key, tuple):
            for c in self.rows:
                if (c.a, c.b) == key or (c.b, c.a) == key:
                    return c
            raise KeyError(f"no comparison of {key[0]!r} with {key[1]!r}; made: {[(c.a, c.b) for c in self.rows]}")
        return self.rows[key]

    def verdict(self, a: str, b: str) -> str:
        """The sentence of the comparison of ``a`` with ``b`` (either order)."""
        return self[a, b].sentence

    def table(self) -> Table:
        """One row per comparison: the pair, the seeds, the difference with its 95% interval, the
        Holm-adjusted p-value and the verdict (a column of diverged runs when there were any)."""
        any_diverged = any(sum(c.diverged.values()) for c in self.rows)
        header = ["comparison", "seeds", "difference [95% CI]", "p (Holm)", "verdict"]
        rows = []
        for c in self.rows:
            p = "<0.001" if c.p_holm < 0.001 else f"{c.p_holm:.3f}"
            row = [f"{c.a} − {c.b}", c.n if c.paired else f"{c.n}, unpaired", c.interval, p, c.short]
            if any_diverged:
                row.append(", ".join(f"{k} {v}" for k, v in c.diverged.items() if v) or "none")
            rows.append(row)
        header += ["diverged runs"] if any_diverged else []
        if self.measures is not None:
            header, rows = [self.label, *header], [[m, *row] for m, row in zip(self.measures, rows)]
        return Table(header, rows)

    def __repr__(self) -> str:
        return repr(self.table())

    def _repr_markdown_(self) -> str:
        return self.table()._repr_markdown_()


def by_measure(families: Mapping[str, Comparisons], label: str = "measure") -> Comparisons:
    """Several questions' comparisons (``compare`` calls) shown as one table, and therefore tested
    as one family: Holm's adjustment is redone over every row of the table. The first column,
    headed ``label``, names each row's measure (or setting); ``result[measure]`` gives that
    measure's comparisons with the table's adjustment, for the sentences the text quotes."""
    if not isinstance(families, Mapping) or not families or not all(isinstance(f, Comparisons) for f in families.values()):
        raise TypeError(f"families must map measure names to compare() results, got {describe(families)}")
    rows = [c for f in families.values() for c in f]
    measures = [m for m, f in families.items() for _ in f]
    adjusted = holm([c.p for c in rows])
    rows = [replace(c, p_holm=float(p), family=len(rows), winner=_winner(c.a, c.b, c.diff, float(p), c.higher))
            for c, p in zip(rows, adjusted)]
    return Comparisons(rows, measures, label)


def _winner(a: str, b: str, diff: float, p_holm: float, higher: bool | None) -> str | None:
    """The better arm (the larger one when ``higher`` is None) if the adjusted test rejects."""
    if p_holm >= ALPHA or diff == 0:
        return None
    return a if (diff > 0) == (higher is not False) else b


def _as_results(results: Mapping[str, Sequence[float]], diverged: str | float | None, higher: bool | None,
                paired: bool, least: int = 2, what: str = "results") -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Check ``least`` or more arms of per-seed results, and replace diverged (non-finite) runs
    as ``diverged`` says. Returns the arms as arrays and how many runs of each diverged."""
    if not isinstance(results, Mapping) or len(results) < least:
        raise ValueError(f"{what} must map at least {least} names to per-seed results, got {describe(results)}")
    arms, lost = {}, {}
    for name, values in results.items():
        try:
            v = np.asarray(values, dtype=float)
        except (TypeError, ValueError):
            raise TypeError(f"{what}[{name!r}] must be a 1-D sequence of numbers, got {describe(values)}") from None
        if v.ndim != 1 or len(v) < 2:
            raise ValueError(f"{what}[{name!r}] must hold one result per seed, at least 2 seeds, got shape {v.shape}")
        arms[name], lost[name] = v, int(np.sum(~np.isfinite(v)))
    if paired and len({len(v) for v in arms.values()}) > 1:
        sizes = {k: len(v) for k, v in arms.items()}
        raise ValueError(f"paired results must be aligned by seed, one value per seed in every arm; got {sizes}")
    if any(lost.values()):
        if diverged is None:
            bad = {k: v for k, v in lost.items() if v}
            raise ValueError(
                f"results hold diverged (NaN or infinite) runs, {bad}: say how to count them with "
                f"diverged='worst' (the worst finite result of the call) or diverged=<a value>"
            )
        if diverged == "worst":
            if higher is None:
                raise ValueError("diverged='worst' needs a better side (higher=True or False); give a value instead")
            finite = np.concatenate([v[np.isfinite(v)] for v in arms.values()])
            if len(finite) == 0:
                raise ValueError("every run diverged: there is no finite result to count them as")
            fill = float(finite.min() if higher else finite.max())
        else:
            fill = check_number(diverged, "diverged", "'worst' or a finite number")
        arms = {k: np.where(np.isfinite(v), v, fill) for k, v in arms.items()}
    return arms, lost


def _pairs(names: list[str], baseline: str | None, pairs: Sequence[tuple[str, str]] | None) -> list[tuple[str, str]]:
    """The pairs to compare: every arm against ``baseline``, the given ``pairs`` (checked), or
    every pair of arms in order."""
    if baseline is not None and pairs is not None:
        raise ValueError("give baseline or pairs, not both")
    if baseline is not None:
        if baseline not in names:
            raise ValueError(f"baseline must be one of the arms {tuple(names)}, got {describe(baseline)}")
        return [(n, baseline) for n in names if n != baseline]
    if pairs is None:
        return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    pairs = list(pairs)
    if not pairs:
        raise ValueError("pairs must name at least one pair of arms")
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(p in names for p in pair) and pair[0] != pair[1]):
            raise ValueError(f"each pair must be two different arms of {tuple(names)}, got {describe(pair)}")
    return pairs


def compare(
    results: Mapping[str, Sequence[float]],
    baseline: str | None = None,
    pairs: Sequence[tuple[str, str]] | None = None,
    higher: bool | None = True,
    paired: bool = True,
    method: str = "t",
    diverged: str | float | None = None,
    digits: int = 3,
    draws: int = 10_000,
    seed: int = 0,
) -> Comparisons:
    """Compare arms run over the same seeds, as one family of tests.

    Args:
        results: arm name -> per-seed results ``(n_seeds,)``, aligned by seed across arms.
        baseline: compare every other arm against this one (``arm − baseline``); or
        pairs: the ``(a, b)`` pairs to compare (``a − b``); neither: every pair, in order.
        higher: a larger result is better (accuracy); False when smaller is (loss, steps);
            None when neither side is better (a norm, a ratio): the verdict says which is larger.
        paired: the arms share seeds (the default). False for arms whose runs cannot share
            seeds: Welch's unpaired interval, labelled "unpaired".
        method: ``"t"``, Student t over the paired differences; ``"bootstrap"``, a percentile
            bootstrap interval and test (``draws`` resamples from ``seed``), for differences far
            from normal.
        diverged: how to count non-finite (diverged) runs: ``"worst"`` (the worst finite result
            of the call) or a value; None raises if any run diverged. The table reports them.
        digits: decimals printed.

    Returns the comparisons, their p-values Holm-adjusted over the call.
    """
    if higher is not None:
        check_bool(higher, "higher")
    check_bool(paired, "paired")
    check_choice(method, ("t", "bootstrap"), "method")
    check_int(digits, "digits")
    check_positive_int(draws, "draws")
    arms, lost = _as_results(results, diverged, higher, paired)
    names = list(arms)
    if not all(isinstance(k, str) for k in names):
        raise TypeError(f"results' keys must be arm names (str), got {names}")
    pairs = _pairs(names, baseline, pairs)

    stats = []
    for a, b in pairs:
        if not paired:
            stats.append(_welch(arms[a], arms[b], 1 - ALPHA))
        elif method == "t":
            stats.append(_t_test(arms[a] - arms[b], 1 - ALPHA))
        else:
            stats.append(_bootstrap(arms[a] - arms[b], 1 - ALPHA, draws, seed))
    adjusted = holm([p for _, _, p in stats])
    rows = []
    for (a, b), (low, high, p), p_holm in zip(pairs, stats, adjusted):
        diff = float(arms[a].mean() - arms[b].mean())
        rows.append(Comparison(a, b, len(arms[a]) if paired else min(len(arms[a]), len(arms[b])), diff, low, high,
                               p, float(p_holm), len(pairs), higher, paired, digits,
                               _winner(a, b, diff, float(p_holm), higher), {a: lost[a], b: lost[b]}))
    return Comparisons(rows)


@dataclass(frozen=True)
class Selection:
    """Each arm's setting chosen on validation: ``setting[arm]``, its mean validation result
    ``validation[arm]`` and the per-seed test results ``test[arm]`` at that setting only."""

    setting: dict[str, Hashable]
    validation: dict[str, float]
    test: dict[str, np.ndarray]

    def table(self, digits: int = 3) -> Table:
        """Arm, chosen setting, mean validation result there, test result there (mean [95% CI])."""
        return Table(["arm", "setting chosen on validation", "validation (mean)", "test at that setting [95% CI]"],
                     [[a, self.setting[a], f"{self.validation[a]:.{digits}f}", ci(self.test[a], digits)]
                      for a in self.setting])


def select(
    validation: Mapping[str, Mapping[Hashable, Sequence[float]]],
    test: Mapping[str, Mapping[Hashable, Sequence[float]]] | Callable[[str, Hashable], Sequence[float]],
    higher: bool = True,
    diverged: str | float | None = "worst",
) -> Selection:
    """Pick each arm's best setting of a grid on validation results, and return the test
    results at that setting.

    Args:
        validation: arm -> setting -> per-seed validation results ``(n_seeds,)``; the best
            setting has the best mean (ties: the first in the grid's order).
        test: the same mapping of test results, or a function ``test(arm, setting)`` that computes
            them, called only at each arm's chosen setting.
        higher: a larger result is better.
        diverged: a non-finite validation result counts as the worst finite one (``"worst"``),
            as the value given, or raises (None).

    The test results never enter the choice: a setting is picked before any test result is read.
    """
    check_bool(higher, "higher")
    if not isinstance(validation, Mapping) or not validation:
        raise ValueError(f"validation must map arm names to {{setting: per-seed results}}, got {describe(validation)}")
    setting, best_val, chosen = {}, {}, {}
    for arm, grid in validation.items():
        if not isinstance(grid, Mapping) or not grid:
            raise ValueError(f"validation[{arm!r}] must map settings to per-seed results, got {describe(grid)}")
        values, _ = _as_results(grid, diverged, higher, False, least=1, what=f"validation[{arm!r}]")
        means = [values[s].mean() for s in grid]
        i = int(np.argmax(means) if higher else np.argmin(means))
        setting[arm], best_val[arm] = list(grid)[i], float(means[i])
    for arm, s in setting.items():
        if callable(test):
            values = test(arm, s)
        else:
            if arm not in test or s not in test[arm]:
                raise ValueError(f"test has no results for arm {arm!r} at its chosen setting {s!r}")
            values = test[arm][s]
        chosen[arm] = np.asarray(values, dtype=float)
    return Selection(setting, best_val, chosen)


def rms_ratio(err_sq: Sequence[float], true_sq: Sequence[float], rng: np.random.Generator,
              draws: int = 2000) -> tuple[float, float, float]:
    """``sqrt(mean(err_sq) / mean(true_sq))``, the ratio of an error's RMS to the true value's
    over paired draws ``(n,)``, and its 95% percentile bootstrap interval (the draws resampled
    with replacement, numerator and denominator together). Returns ``(ratio, low, high)``."""
    e, t = np.asarray(err_sq, dtype=float), np.asarray(true_sq, dtype=float)
    if e.ndim != 1 or e.shape != t.shape or len(e) < 2 or np.any(e < 0) or np.any(t <= 0):
        raise ValueError(f"err_sq and true_sq must be 1-D, of one length >= 2, err_sq >= 0 and true_sq > 0; "
                         f"got {describe(err_sq)} and {describe(true_sq)}")
    check_positive_int(draws, "draws")
    i = rng.integers(0, len(e), size=(draws, len(e)))
    low, high = np.quantile(np.sqrt(e[i].mean(1) / t[i].mean(1)), [ALPHA / 2, 1 - ALPHA / 2])
    return float(np.sqrt(e.mean() / t.mean())), float(low), float(high)


@functools.lru_cache(maxsize=4)
def _resamples(seeds: int, items: int, draws: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The bootstrap's draws, ``(draws, seeds)`` and ``(draws, items)``: how often each seed and
    each item is drawn. They depend only on the shape and the seed, so every pair of a call, and
    every call of the same shape, shares them (drawing the items' counts is the slow part)."""
    rng = np.random.default_rng(seed)
    ws = rng.multinomial(seeds, np.full(seeds, 1 / seeds), size=draws).astype(float)
    wi = rng.multinomial(items, np.full(items, 1 / items), size=draws).astype(float)
    ws.flags.writeable = wi.flags.writeable = False
    return ws, wi


def _two_level(d: np.ndarray, level: float, draws: int, seed: int) -> tuple[float, float, float]:
    """The paired two-level bootstrap of the mean of ``d (seeds, items)``: each draw resamples
    the seeds and, independently, the items (both with replacement, the same draw for both arms,
    so the pairing is kept) and takes the mean of the resampled block. Returns the percentile
    interval at ``level`` and the test of mean 0 (the share of centred resampled means at least
    as far from 0 as the observed one)."""
    s, n = d.shape
    ws, wi = _resamples(s, n, draws, seed)
    means = np.einsum("dn,dn->d", ws @ d, wi) / (s * n)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    centred = means - d.mean()
    p = (1 + np.sum(np.abs(centred) >= abs(d.mean()))) / (draws + 1) if np.ptp(d) > 0 else float(d.mean() == 0)
    return float(low), float(high), float(min(p, 1.0))


def compare_items(
    results: Mapping[str, np.ndarray],
    baseline: str | None = None,
    pairs: Sequence[tuple[str, str]] | None = None,
    higher: bool | None = True,
    digits: int = 3,
    draws: int = 10_000,
    seed: int = 0,
) -> Comparisons:
    """:func:`compare` for results scored item by item on one shared test set: the interval
    counts the sampling of the test items as well as that of the seeds.

    Args:
        results: arm name -> ``(n_seeds, n_items)`` per-item scores (1/0 for right/wrong), row
            ``s`` from seed ``s`` and column ``i`` from test item ``i`` in every arm.
        baseline, pairs, higher, digits: as in :func:`compare`.
        draws, seed: the paired two-level bootstrap (seeds and items resampled independently,
            the same resample for both arms of a pair; percentile interval and test).

    The difference is mean(a) - mean(b) over seeds and items (the mean per-seed accuracy
    difference); the p-values are Holm-adjusted over the call. Resampling both levels counts the
    seeds' own item noise twice, so the interval errs wide.
    """
    if higher is not None:
        check_bool(higher, "higher")
    check_int(digits, "digits")
    check_positive_int(draws, "draws")
    if not isinstance(results, Mapping) or len(results) < 2:
        raise ValueError(f"results must map at least 2 names to (seeds, items) arrays, got {describe(results)}")
    arms = {}
    for name, values in results.items():
        if not isinstance(name, str):
            raise TypeError(f"results' keys must be arm names (str), got {describe(name)}")
        try:
            v = np.asarray(values, dtype=float)
        except (TypeError, ValueError):
            raise TypeError(f"results[{name!r}] must be a (seeds, items) array of numbers, got {describe(values)}") from None
        if v.ndim != 2 or v.shape[0] < 2 or v.shape[1] < 2 or not np.isfinite(v).all():
            raise ValueError(f"results[{name!r}] must be a finite (seeds, items) array, at least 2 x 2, got shape {v.shape}")
        arms[name] = v
    if len({v.shape for v in arms.values()}) > 1:
        raise ValueError(f"results must share one (seeds, items) shape, got { {k: v.shape for k, v in arms.items()} }")
    names = list(arms)
    pairs = _pairs(names, baseline, pairs)
    stats = [_two_level(arms[a] - arms[b], 1 - ALPHA, draws, seed) for a, b in pairs]
    adjusted = holm([p for _, _, p in stats])
    rows = []
    for (a, b), (low, high, p), p_holm in zip(pairs, stats, adjusted):
        diff = float(arms[a].mean() - arms[b].mean())
        rows.append(Comparison(a, b, arms[a].shape[0], diff, low, high, p, float(p_holm), len(pairs), higher, True,
                               digits, _winner(a, b, diff, float(p_holm), higher), {a: 0, b: 0}))
    return Comparisons(rows)
