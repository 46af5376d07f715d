"""Meta-evaluation: how well a metric agrees with human labels on the same rows (SPEC 2.7).

* :func:`correlations` -- Pearson, Spearman and Kendall correlation of a metric with
  human scores, with p-values and percentile bootstrap confidence intervals.
* :func:`agreement` -- raw agreement and Cohen's kappa for categorical labels.
* :func:`meta_evaluate` -- a table laid out like Figure 2 of the IBM paper (seed
  000): one row per (metric, human column, subset) with the mean score and the
  correlations, for all rows and without the rows where the metric abstained.
* :func:`meta_metrics` -- that table as flat ``meta/<metric>/<human>/<stat>``
  metrics for ``mlflow.log_metrics``.

Missing values (``None``, NaN, failed or abstained :class:`~mlflow_ragjudge.core.types.JudgeResult`)
drop the pair and are counted in ``n_dropped``; an undefined statistic (constant
input, too few pairs) is ``None`` with a ``reason``, never NaN. Bootstrap
resampling uses a :class:`numpy.random.Generator` from an explicit seed, so the
intervals are reproducible.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..core.types import JudgeResult, Status, metric_name_part
from .agreement import cohen_kappa, complete_pairs

__all__ = [
    "COEFFICIENTS",
    "SUBSETS",
    "correlations",
    "agreement",
    "meta_evaluate",
    "meta_metrics",
]

#: The correlation coefficients reported, in order.
COEFFICIENTS: tuple[str, ...] = ("pearson", "spearman", "kendall")
#: The row subsets of :func:`meta_evaluate`.
SUBSETS: tuple[str, ...] = ("all", "no_abstentions")
_MIN_PAIRS = 3
_BOOT_BLOCK_CELLS = 2_000_000  # resampled values held in memory at once (per array)


# ---------------------------------------------------------------------------------------------
# Value coercion
# ---------------------------------------------------------------------------------------------


def _is_missing(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float | np.floating) and math.isnan(value)


def _number(value: Any, where: str) -> tuple[float | None, bool]:
    """``(value as float or None, abstained?)`` for one cell."""
    if isinstance(value, JudgeResult):
        if value.status is Status.SCORED:
            return float(value.value), False  # type: ignore[arg-type]
        return None, value.status is Status.ABSTAINED
    if _is_missing(value):
        return None, False
    if isinstance(value, numbers.Real):  # int, float, bool, numpy numbers
        number = float(value)
        return (None, False) if math.isnan(number) else (number, False)
    raise TypeError(
        f"{where} holds {value!r} ({type(value).__name__}); expected a number, None/NaN for a missing "
        "value, or a JudgeResult -- convert labels such as '4' or 'Yes' to numbers first, e.g. "
        "df[col].astype(float)"
    )


def _as_list(values: Any, name: str) -> list[Any]:
    if isinstance(values, str | bytes):
        raise TypeError(f"{name} must be a sequence of values, not a single string")
    return list(values)


# ---------------------------------------------------------------------------------------------
# Correlations
# ---------------------------------------------------------------------------------------------


def _point(coef: str, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    from scipy import stats  # start-up time: scipy.stats takes a second to import; only meta-evaluation needs it

    if coef == "pearson":
        res = stats.pearsonr(x, y)
    elif coef == "spearman":
        res = stats.spearmanr(x, y)
    else:
        res = stats.kendalltau(x, y)  # tau-b, which handles ties
    return float(res.statistic), float(res.pvalue)


def _rowwise_pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair of two (B, n) arrays; NaN where a row is constant."""
    xc = x - x.mean(axis=1, keepdims=True)
    yc = y - y.mean(axis=1, keepdims=True)
    den = np.sqrt((xc * xc).sum(axis=1) * (yc * yc).sum(axis=1))
    num = (xc * yc).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = num / den
    constant = (np.ptp(x, axis=1) == 0) | (np.ptp(y, axis=1) == 0)
    r[constant] = np.nan
    return np.clip(r, -1.0, 1.0)


def _bootstrap(x: np.ndarray, y: np.ndarray, rng: np.random.Generator, n_boot: int) -> dict[str, np.ndarray]:
    """Each coefficient on ``n_boot`` resamples of the pairs (NaN where undefined)."""
    from scipy import stats  # start-up time, as in _point

    n = len(x)
    out = {coef: np.full(n_boot, np.nan) for coef in COEFFICIENTS}
    # Resample in blocks so that memory stays bounded for long inputs.
    block = max(1, _BOOT_BLOCK_CELLS // n)
    for start in range(0, n_boot, block):
        stop = min(n_boot, start + block)
        idx = rng.integers(0, n, size=(stop - start, n))
        bx, by = x[idx], y[idx]
        out["pearson"][start:stop] = _rowwise_pearson(bx, by)
        # Spearman's rho is Pearson's r of the (average-tie) ranks, as scipy computes it.
        out["spearman"][start:stop] = _rowwise_pearson(stats.rankdata(bx, axis=1), stats.rankdata(by, axis=1))
        for b in range(stop - start):
            if np.ptp(bx[b]) > 0 and np.ptp(by[b]) > 0:
                out["kendall"][start + b] = stats.kendalltau(bx[b], by[b]).statistic
    return out


def _generator(seed: int | np.random.Generator) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int or a numpy.random.Generator, got {seed!r}")
    return np.random.default_rng(int(seed))


def correlations(
    metric_values: Sequence[Any] | pd.Series | np.ndarray,
    human_values: Sequence[Any] | pd.Series | np.ndarray,
    *,
    n_boot: int = 1000,
    seed: int | np.random.Generator = 0,
    ci: float = 0.95,
) -> dict[str, Any]:
    """Pearson, Spearman and Kendall (tau-b) correlation with bootstrap intervals.

    Point estimates and p-values are ``scipy.stats.pearsonr``, ``spearmanr`` and
    ``kendalltau`` on all complete pairs. The confidence intervals are percentile
    bootstrap intervals (Efron & Tibshirani 1993, ch. 13): the pairs are resampled
    with replacement ``n_boot`` times, the coefficient is computed on each resample,
    and the interval is the ``(1 - ci) / 2`` and ``(1 + ci) / 2`` quantiles of those
    values. Resamples on which a coefficient is undefined (one side constant) are
    left out; ``n_boot_valid`` counts the rest.

    Args:
        metric_values: the metric's value per row (numbers; ``None``/NaN, or an
            abstained/failed JudgeResult, for no value).
        human_values: the human score per row, aligned with ``metric_values``.
        n_boot: bootstrap resamples; 0 skips the intervals.
        seed: seed of the bootstrap's random generator (or a Generator).
        ci: confidence level of the intervals, in (0, 1).

    Returns:
        A dict with ``n`` (complete pairs used), ``n_dropped`` (pairs with a missing
        side), ``ci``, ``n_boot``, ``n_boot_valid``, ``reason`` (why the
        coefficients are ``None``, else ``None``) and, for each of ``pearson``,
        ``spearman`` and ``kendall``: the coefficient, ``<name>_p``,
        ``<name>_ci_low`` and ``<name>_ci_high``. Undefined values are ``None``,
        never NaN.

    Raises:
        ValueError: when the two inputs differ in length, or ``n_boot``/``ci`` are
            out of range.
        TypeError: when a value is neither a number nor missing.
    """
    xs = _as_list(metric_values, "metric_values")
    ys = _as_list(human_values, "human_values")
    if len(xs) != len(ys):
        raise ValueError(
            f"metric_values and human_values must be aligned row by row, got {len(xs)} and {len(ys)} values"
        )
    if not isinstance(n_boot, numbers.Integral) or n_boot < 0:
        raise ValueError(f"n_boot must be a non-negative integer, got {n_boot!r}")
    if not 0 < ci < 1:
        raise ValueError(f"ci must be a confidence level between 0 and 1 (e.g. 0.95), got {ci!r}")
    pairs: list[tuple[float, float]] = []
    for i, (a, b) in enumerate(zip(xs, ys, strict=True)):
        va, _ = _number(a, f"metric_values[{i}]")
        vb, _ = _number(b, f"human_values[{i}]")
        if va is not None and vb is not None:
            pairs.append((va, vb))
    return _correlate(pairs, len(xs) - len(pairs), n_boot=int(n_boot), rng=_generator(seed), ci=ci)


def _correlate(
    pairs: list[tuple[float, float]], n_dropped: int, *, n_boot: int, rng: np.random.Generator, ci: float
) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(pairs), "n_dropped": n_dropped, "ci": ci, "n_boot": n_boot}
    for coef in COEFFICIENTS:
        out.update({coef: None, f"{coef}_p": None, f"{coef}_ci_low": None, f"{coef}_ci_high": None})
    out["n_boot_valid"] = {coef: 0 for coef in COEFFICIENTS}
    x = np.array([p[0] for p in pairs], dtype=float)
    y = np.array([p[1] for p in pairs], dtype=float)
    if len(pairs) < _MIN_PAIRS:
        out["reason"] = f"fewer than {_MIN_PAIRS} complete pairs ({len(pairs)})"
        return out
    constant = [name for name, v in (("metric", x), ("human", y)) if np.ptp(v) == 0]
    if constant:
        out["reason"] = f"constant {' and '.join(constant)} values: correlation is undefined"
        return out
    out["reason"] = None
    for coef in COEFFICIENTS:
        value, p = _point(coef, x, y)
        out[coef] = value
        out[f"{coef}_p"] = None if math.isnan(p) else p
    if n_boot:
        boots = _bootstrap(x, y, rng, n_boot)
        lo_q, hi_q = (1 - ci) / 2, (1 + ci) / 2
        for coef in COEFFICIENTS:
            valid = boots[coef][~np.isnan(boots[coef])]
            out["n_boot_valid"][coef] = int(valid.size)
            if valid.size:
                lo, hi = np.quantile(valid, [lo_q, hi_q])
                out[f"{coef}_ci_low"], out[f"{coef}_ci_high"] = float(lo), float(hi)
    return out


# ---------------------------------------------------------------------------------------------
# Categorical agreement
# ---------------------------------------------------------------------------------------------


def agreement(labels_a: Iterable[Hashable | None], labels_b: Iterable[Hashable | None]) -> dict[str, Any]:
    """Raw agreement and Cohen's kappa between two sets of categorical labels.

    With ``p_o`` the share of rows where the labels are equal and
    ``p_e = Σ_k p_a(k) p_b(k)`` the agreement expected by chance from each side's
    label frequencies, ``kappa = (p_o - p_e) / (1 - p_e)`` (Cohen 1960; computed by
    :func:`mlflow_ragjudge.engine.agreement.cohen_kappa`). Labels are
    compared with ``==`` (so ``1`` and ``"1"`` differ). Rows where either label is
    missing (``None``/NaN) are dropped.

    Args:
        labels_a: e.g. the judge's verdicts.
        labels_b: e.g. the human labels, aligned with ``labels_a``.

    Returns:
        ``{"agreement", "cohen_kappa", "n", "n_dropped", "reason"}``; ``agreement``
        and ``cohen_kappa`` are ``None`` when there are no complete rows, and
        ``cohen_kappa`` is ``None`` when chance agreement is 1 (both sides always
        give the same single label), with ``reason`` saying so.

    Raises:
        ValueError: when the inputs differ in length.
    """
    a_list = _as_list(labels_a, "labels_a")
    b_list = _as_list(labels_b, "labels_b")
    if len(a_list) != len(b_list):
        raise ValueError(
            f"labels_a and labels_b must be aligned row by row, got {len(a_list)} and {len(b_list)} labels"
        )
    pairs, n_dropped = complete_pairs(a_list, b_list)
    n = len(pairs)
    out: dict[str, Any] = {
        "agreement": None,
        "cohen_kappa": None,
        "n": n,
        "n_dropped": n_dropped,
        "reason": None,
    }
    if n == 0:
        out["reason"] = "no rows with both labels"
        return out
    out["agreement"] = sum(a == b for a, b in pairs) / n
    out["cohen_kappa"] = cohen_kappa([a for a, _ in pairs], [b for _, b in pairs])
    if out["cohen_kappa"] is None:
        out["reason"] = "chance agreement is 1 (both sides use one single label): kappa is undefined"
    return out


# ---------------------------------------------------------------------------------------------
# Figure-2 table and MLflow metrics
# ---------------------------------------------------------------------------------------------


def _columns(value: str | Sequence[str], what: str, df: pd.DataFrame) -> list[str]:
    cols = [value] if isinstance(value, str) else list(value)
    if not cols:
        raise ValueError(f"{what} is empty: name at least one column of the DataFrame")
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise KeyError(
            f"{what} names column(s) {missing} that the DataFrame does not have; "
            f"available columns: {list(df.columns)}"
        )
    return cols


def _abstain_flags(df: pd.DataFrame, metric: str, abstain_mask: Any, abstain_values: Any) -> np.ndarray:
    flags = np.zeros(len(df), dtype=bool)
    mask = abstain_mask.get(metric) if isinstance(abstain_mask, Mapping) else abstain_mask
    if mask is not None:
        if isinstance(mask, str):
            if mask not in df.columns:
                raise KeyError(
                    f"abstain_mask names column {mask!r} that the DataFrame does not have; it should hold "
                    "True for rows where the metric abstained"
                )
            mask = df[mask]
        arr = np.asarray(pd.Series(mask).fillna(False).to_numpy(), dtype=bool)
        if arr.shape != (len(df),):
            raise ValueError(
                f"abstain_mask for {metric!r} has {arr.size} values; it needs one boolean per row ({len(df)})"
            )
        flags |= arr
    values = abstain_values.get(metric) if isinstance(abstain_values, Mapping) else abstain_values
    if values is not None:
        if isinstance(values, numbers.Real):
            values = [values]
        targets = {float(v) for v in values}
        for i, cell in enumerate(df[metric].tolist()):
            if isinstance(cell, numbers.Real) and not _is_missing(cell) and float(cell) in targets:
                flags[i] = True
    return flags


def meta_evaluate(
    df: pd.DataFrame,
    metric_columns: str | Sequence[str],
    human_columns: str | Sequence[str],
    *,
    abstain_mask: Any = None,
    abstain_values: Any = None,
    n_boot: int = 1000,
    seed: int = 0,
    ci: float = 0.95,
    human_not_sure: Any = None,
) -> pd.DataFrame:
    """Correlate each metric column with each human column, like the IBM paper's Figure 2.

    Two subsets of rows are evaluated for every (metric, human) pair:

    * ``all`` -- every row where both values are present; numeric abstention
      values (e.g. the six-level judge's 0) are kept as numbers;
    * ``no_abstentions`` -- the same without the rows where the metric abstained
      (the paper's "mean excluding score 0").

    A row counts as abstained for a metric when its cell is an abstained
    :class:`~mlflow_ragjudge.core.types.JudgeResult`, when ``abstain_mask`` flags it, or
    when its value is one of ``abstain_values``. Failed results and missing values
    are dropped from both subsets.

    Args:
        df: one row per judged item.
        metric_columns: the metric column(s) (numbers or JudgeResult objects).
        human_columns: the human score column(s) (numbers).
        abstain_mask: a boolean column name or array (True = the metric abstained),
            or a mapping metric column -> such a mask.
        abstain_values: metric values that mean "abstained" (e.g. ``[0]``), or a
            mapping metric column -> such values.
        n_boot: bootstrap resamples per cell (0 = no intervals).
        seed: bootstrap seed; every cell uses the same seed, so a cell's interval
            does not depend on which other columns are evaluated.
        ci: confidence level of the intervals.
        human_not_sure: human values that mean "not sure" (e.g. ``[0]`` on the six-level scale), or a mapping
            human column -> such values: those rows are left out of both subsets for that human column, as
            the paper's expert mean leaves them out, and counted in ``n_human_not_sure``.

    Returns:
        A DataFrame with one row per (metric, human, subset) and the columns
        ``metric, human, subset, n, n_dropped, n_abstained, n_human_not_sure, mean, human_mean``
        (``n`` pairs used; ``n_abstained`` rows where the metric abstained, the
        same in both subsets; ``n_dropped`` other rows left out for a missing
        value; ``mean`` and ``human_mean`` over the ``n`` pairs used),
        then ``<coef>, <coef>_p, <coef>_ci_low, <coef>_ci_high`` for pearson,
        spearman and kendall, then ``reason``. Undefined values are ``None``.

    Raises:
        KeyError: when a named column is missing (the message lists the columns).
        TypeError: when a cell is neither a number, missing, nor a JudgeResult.
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    metrics = _columns(metric_columns, "metric_columns", df)
    humans = _columns(human_columns, "human_columns", df)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {seed!r}")
    rows: list[dict[str, Any]] = []
    for metric in metrics:
        flags = _abstain_flags(df, metric, abstain_mask, abstain_values)
        parsed = [_number(v, f"column {metric!r}, row {i}") for i, v in enumerate(df[metric].tolist())]
        abstained = flags | np.array([a for _, a in parsed], dtype=bool)
        m_values = [v for v, _ in parsed]
        for human in humans:
            h_values = [_number(v, f"column {human!r}, row {i}")[0] for i, v in enumerate(df[human].tolist())]
            unsure_values = human_not_sure.get(human) if isinstance(human_not_sure, Mapping) else human_not_sure
            unsure = {float(x) for x in (unsure_values or [])}
            not_sure = [h is not None and float(h) in unsure for h in h_values]
            for subset in SUBSETS:
                cell = _cell(m_values, h_values, abstained, not_sure, subset, n_boot=int(n_boot), seed=int(seed), ci=ci)
                rows.append({"metric": metric, "human": human, "subset": subset, **cell})
    table = pd.DataFrame(rows)
    # object dtype keeps None as None (a float column would turn it into NaN).
    return table.astype(object).where(table.notna(), None)





def _cell(
    m_values: list[float | None],
    h_values: list[float | None],
    abstained: np.ndarray,
    not_sure: list[bool],
    subset: str,
    *,
    n_boot: int,
    seed: int,
    ci: float,
) -> dict[str, Any]:
    """One (metric, human, subset) row of :func:`meta_evaluate`, without its three names."""
    n_rows = len(m_values)
    skip_abstained = subset == "no_abstentions"
    n_abst = int(abstained.sum())
    keep = [
        i
        for i in range(n_rows)
        if not (skip_abstained and abstained[i])
        and not not_sure[i]
        and m_values[i] is not None
        and h_values[i] is not None
    ]
    pairs = [(m_values[i], h_values[i]) for i in keep]
    excluded = (n_abst if skip_abstained else 0) + sum(
        1 for i in range(n_rows) if not_sure[i] and not (skip_abstained and abstained[i])
    )
    result = _correlate(
        pairs,  # type: ignore[arg-type]
        n_rows - excluded - len(pairs),
        n_boot=n_boot,
        rng=np.random.default_rng(seed),
        ci=ci,
    )
    row: dict[str, Any] = {
        "n": result["n"],
        "n_dropped": result["n_dropped"],
        "n_abstained": n_abst,
        "n_human_not_sure": sum(not_sure),
        "mean": float(np.mean([p[0] for p in pairs])) if pairs else None,  # type: ignore[misc]
        "human_mean": float(np.mean([p[1] for p in pairs])) if pairs else None,  # type: ignore[misc]
    }
    for coef in COEFFICIENTS:
        for key in (coef, f"{coef}_p", f"{coef}_ci_low", f"{coef}_ci_high"):
            row[key] = result[key]
    row["reason"] = result["reason"]
    return row


def meta_metrics(table: pd.DataFrame, *, prefix: str = "meta") -> dict[str, float]:
    """Flatten a :func:`meta_evaluate` table into MLflow metrics.

    Names are ``<prefix>/<metric>/<human>/<stat>`` for the ``all`` subset and
    ``<prefix>/<metric>/<human>/no_abstentions/<stat>`` for the other, where
    ``<stat>`` is ``n``, ``mean``, ``human_mean``, and for each coefficient
    ``<coef>``, ``<coef>_p``, ``<coef>_ci_low``, ``<coef>_ci_high`` (e.g.
    ``meta/correctness/expert/spearman_ci_low``). A metric or column name MLflow would
    refuse is made safe injectively (:func:`mlflow_ragjudge.core.types.metric_name_part`: ``expert:avg``
    becomes ``expert_avg__<hash>``); undefined values are left out, never logged as NaN.

    Args:
        table: the output of :func:`meta_evaluate`.
        prefix: the first path segment.

    Returns:
        ``{name: value}`` ready for ``mlflow.log_metrics``.

    Raises:
        KeyError: when ``table`` lacks the ``metric``/``human``/``subset`` columns.
    """
    needed = {"metric", "human", "subset"}
    if not needed <= set(table.columns):
        raise KeyError(
            f"table needs the columns {sorted(needed)} (the output of meta_evaluate); "
            f"got {list(table.columns)}"
        )
    stats_order = ["n", "mean", "human_mean"] + [
        f"{coef}{suffix}" for coef in COEFFICIENTS for suffix in ("", "_p", "_ci_low", "_ci_high")
    ]
    out: dict[str, float] = {}
    for rec in table.to_dict(orient="records"):
        base = f"{metric_name_part(prefix)}/{metric_name_part(rec['metric'])}/{metric_name_part(rec['human'])}"
        if rec["subset"] != "all":
            base += f"/{metric_name_part(rec['subset'])}"
        for stat in stats_order:
            value = rec.get(stat)
            if value is None or _is_missing(value):
                continue
            out[f"{base}/{stat}"] = float(value)
    return out
