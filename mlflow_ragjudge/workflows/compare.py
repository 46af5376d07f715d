"""Paired comparison of RAG variants scored on the same rows: which differences are more than noise.

For every metric and every variant against the baseline, on the rows **both** scored (a row a judge failed on,
abstained on -- correctness level 0 -- or could not score in one of the two is left out of that pair):

* ``mean`` and ``baseline_mean`` over those rows, ``mean_diff`` = mean of the per-row differences
  ``variant - baseline``;
* ``ci_low`` / ``ci_high``: a paired percentile bootstrap interval of ``mean_diff`` (rows resampled with
  replacement, ``n_boot`` resamples, ``1 - alpha`` level, seeded: ``scipy.stats.bootstrap`` on the per-row
  differences);
* ``p_value``: the Wilcoxon signed-rank test of the per-row differences (two-sided; zero differences dropped,
  as Wilcoxon's original rule; ``scipy.stats.wilcoxon``). When every difference is zero there is nothing to
  test: p = 1 (``test = "wilcoxon: all differences zero"``); with fewer than two paired rows no statistic is
  given (``test = "none: fewer than 2 paired rows"``);
* ``p_holm``: Holm's step-down correction over every comparison in the table (variants x metrics), so a table
  of many comparisons does not find differences by chance; ``significant`` = ``p_holm < alpha``;
* ``wins`` / ``ties`` / ``losses``: rows where the variant is better / equal / worse (better is higher, except
  for metrics where lower is better: ``lscore``).
* ``decision``: "is the variant better?" read off the interval of ``mean_diff`` (``ci_low`` / ``ci_high``):
  ``better`` when all of it lies on the better side of 0 (above it; below it where lower is better), ``worse`` when
  all of it lies on the worse side, ``undecided`` when it holds 0 (or there is no interval: fewer than two paired
  rows); ``more_rows``, for an undecided row, about how many more paired rows at the same spread would decide it
  (:func:`~mlflow_ragjudge.engine.intervals.more_rows` of ``n``, the interval's half-width on the side of 0, and
  ``|mean_diff|``; None when ``mean_diff`` is 0). The same rule as an interval gate (docs/judge-client.md).

Which number decides what: ``decision`` is one comparison at the ``1 - alpha`` level, as the interval shows it (what
a single "is B better than A?" asks, the question a CI gate asks); ``significant`` is ``p_holm < alpha``, Wilcoxon's
test corrected for every comparison in the table (what a search over many variants and metrics should trust before
calling a difference found). They can disagree: a ``better`` row that is not ``significant`` is a difference one
comparison alone would take, which the table's many comparisons do not confirm.

:func:`compare_runs` does the same for MLflow runs that already exist (each evaluated by ``ragjudge``), pairing
their per-row tables by row and checking that the rows hold the same questions.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..adapters import tracking
from ..adapters.run_load import load_output
from ..core.types import JudgeResult
from ..engine.intervals import more_rows

__all__ = ["COLUMNS", "HEADLINE", "HEADLINE_PREFIX", "headline_metrics", "paired_comparison", "holm",
           "scores_by_row", "default_metrics", "comparison_figures", "plotted_metrics", "log_comparison",
           "compare_runs", "LOWER_IS_BETTER", "COMPARISON_FILE", "decision"]

#: the comparison table's columns: the variant first and the metric second (MLflow's artifact comparison groups a
#: table by its first column and compares its second)
#: (``decision`` and ``more_rows`` came last, after the table's first release: appended, so a view of it keeps its
#: columns)
COLUMNS = ["variant", "metric", "baseline", "n", "mean", "baseline_mean", "mean_diff", "ci_low", "ci_high",
           "p_value", "p_holm", "wins", "ties", "losses", "test", "significant", "decision", "more_rows"]
#: metrics where a lower value is better (the multi-turn number of judged turns)
LOWER_IS_BETTER = frozenset({"lscore"})
COMPARISON_FILE = "ragjudge/comparison.json"
_AT_K = re.compile(r"_at_\d+$")
#: the metrics a sweep puts first, where present (``sweep(headline=...)`` chooses others)
HEADLINE = ("correctness", "faithfulness")
#: a sweep's child run logs each headline metric's mean again as ``_headline/<metric>``, before anything else: the
#: MLflow 3.17 UI's chart view sorts its sections by name (``localeCompare``: punctuation before letters, capitals
#: among small letters), and its compare-runs page opens the parallel-coordinates plot on the first metric of a run
HEADLINE_PREFIX = "_headline/"


def headline_metrics(available: Sequence[str], asked: Sequence[str] | None = None) -> list[str]:
    """The headline metrics among ``available`` (metric names, in their order): ``asked`` when given (those
    available), else :data:`HEADLINE`'s that are present, else the first two :func:`default_metrics`."""
    if asked is not None:
        return [m for m in dict.fromkeys(asked) if m in available]
    return [m for m in HEADLINE if m in available] or default_metrics(list(available))[:2]


def default_metrics(names: Sequence[str]) -> list[str]:
    """The metrics compared by default: all, except retrieval's ``@k`` families (their cut-off-free
    ``precision``/``recall``/``f1``, ``map``, ``mrr`` and ``ndcg`` stay) and chunk ROUGE-L's precision and F1
    (its recall stays) -- so that Holm's correction is not spent on near-duplicates. Pass ``metrics=`` to choose."""
    return [n for n in names if not _AT_K.search(n) and n not in ("context_rougeL_precision", "context_rougeL_f1")]


def scores_by_row(results: Mapping[str, Sequence[JudgeResult]], rows: Sequence[Any] | None = None
                  ) -> dict[str, dict[Any, float]]:
    """``metric -> {row key: value}`` for the scored rows of one variant's results (``rows``: the keys of the
    result positions, default 0..n-1)."""
    out: dict[str, dict[Any, float]] = {}
    for name, res in results.items():
        keys = list(rows) if rows is not None else list(range(len(res)))
        out[name] = {k: float(r.value) for k, r in zip(keys, res) if r.is_scored and r.value is not None}
    return out


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None): with the m p-values sorted ascending,
    ``p_holm(i) = min(1, max_{j <= i} (m - j + 1) * p_(j))``."""
    present = [(p, i) for i, p in enumerate(p_values) if p is not None]
    m = len(present)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def _pair(x: Mapping[Any, float], y: Mapping[Any, float]) -> tuple[np.ndarray, np.ndarray]:
    keys = [k for k in x if k in y]
    return np.array([x[k] for k in keys], dtype=float), np.array([y[k] for k in keys], dtype=float)


def _bootstrap_ci(d: np.ndarray, alpha: float, n_boot: int, seed: int) -> tuple[float, float]:
    from scipy import stats

    if np.ptp(d) == 0:  # every difference the same: the interval is that value
        return float(d[0]), float(d[0])
    res = stats.bootstrap((d,), np.mean, n_resamples=n_boot, confidence_level=1 - alpha, method="percentile",
                          vectorized=True, random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _wilcoxon(d: np.ndarray) -> tuple[float, str]:
    from scipy import stats

    if not np.any(d != 0):
        return 1.0, "wilcoxon: all differences zero"
    with warnings.catch_warnings():  # scipy warns when it switches to the normal approximation with ties
        warnings.simplefilter("ignore")
        return float(stats.wilcoxon(d, zero_method="wilcox", alternative="two-sided").pvalue), "wilcoxon"


def decision(mean_diff: float | None, ci_low: float | None, ci_high: float | None, n: int,
             lower_is_better: bool = False) -> tuple[str, int | None]:
    """``better`` / ``worse`` / ``undecided`` from the interval of a mean difference (variant - baseline), and for
    ``undecided`` about how many more paired rows would decide it (None when it cannot be said: no interval, or a
    mean difference of 0)."""
    if mean_diff is None or ci_low is None or ci_high is None:
        return "undecided", None
    if ci_low > 0 or ci_high < 0:
        up = ci_low > 0
        return ("better" if up != lower_is_better else "worse"), None
    half = mean_diff - ci_low if mean_diff > 0 else ci_high - mean_diff  # the interval's side toward 0
    return "undecided", more_rows(n, half, abs(mean_diff))


def paired_comparison(scores: Mapping[str, Mapping[str, Mapping[Any, float]]], baseline: str, *,
                      metrics: Sequence[str] | None = None, alpha: float = 0.05, n_boot: int = 2000,
                      seed: int = 0) -> pd.DataFrame:
    """Every variant of ``scores`` (``variant -> metric -> {row: value}``) against ``baseline``, per metric.

    Returns a DataFrame with :data:`COLUMNS` (see the module docstring), one row per (metric, variant); a
    statistic that cannot be computed is None, never NaN.

    Raises:
        ValueError: the baseline is not among the variants, or ``alpha`` is not in (0, 1).
    """
    if baseline not in scores:
        raise ValueError(f"baseline {baseline!r} is not one of the variants {list(scores)}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha!r} must be between 0 and 1, e.g. 0.05")
    base = scores[baseline]
    names = list(metrics) if metrics is not None else default_metrics(
        [m for m in base if any(m in scores[v] for v in scores if v != baseline)])
    rows: list[dict[str, Any]] = []
    for metric in names:
        for variant, per_metric in scores.items():
            if variant == baseline or metric not in per_metric or metric not in base:
                continue
            x, y = _pair(per_metric[metric], base[metric])
            d = x - y
            sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
            row: dict[str, Any] = {"metric": metric, "variant": variant, "baseline": baseline, "n": len(d),
                                   "mean": float(x.mean()) if len(d) else None,
                                   "baseline_mean": float(y.mean()) if len(d) else None,
                                   "mean_diff": float(d.mean()) if len(d) else None,
                                   "wins": int(np.sum(sign * d > 0)), "ties": int(np.sum(d == 0)),
                                   "losses": int(np.sum(sign * d < 0))}
            if len(d) >= 2:
                row["ci_low"], row["ci_high"] = _bootstrap_ci(d, alpha, n_boot, seed)
                row["p_value"], row["test"] = _wilcoxon(d)
            else:
                row.update(ci_low=None, ci_high=None, p_value=None, test="none: fewer than 2 paired rows")
            rows.append(row)
    for row, p in zip(rows, holm([r["p_value"] for r in rows])):
        row["p_holm"] = p
        row["significant"] = bool(p is not None and p < alpha)
        row["decision"], row["more_rows"] = decision(row["mean_diff"], row["ci_low"], row["ci_high"], row["n"],
                                                     row["metric"] in LOWER_IS_BETTER)
    table = pd.DataFrame(rows, columns=COLUMNS).astype(object).where(lambda f: f.notna(), None)
    # (a count beside None is read as a float column: back to whole numbers)
    table["more_rows"] = pd.Series([None if v is None else int(v) for v in table["more_rows"]], index=table.index,
                                   dtype=object)
    return table


# --------------------------------------------------------------------------- plots


def _safe_file(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name)


def plotted_metrics(comparison: pd.DataFrame, headline: Sequence[str] = (), max_plots: int = 12) -> list[str]:
    """The metrics :func:`comparison_figures` plots, in order: the ``headline`` metrics of the table first, always
    (with or without a difference), then up to ``max_plots`` others where some variant differs from the baseline,
    the most significant first."""
    compared = set(comparison["metric"])
    first = [m for m in dict.fromkeys(headline) if m in compared]
    differing = comparison[comparison["mean_diff"].map(lambda v: v is not None and v != 0)
                           & ~comparison["metric"].isin(first)]
    order = (differing.assign(_p=differing["p_holm"].map(lambda p: 1.0 if p is None else p))
             .groupby("metric", sort=False)["_p"].min().sort_values(kind="stable"))
    return first + list(order.index)[:max_plots]


def _wrapped(text: str, ax: Any, fontsize: float) -> str:
    """``text`` wrapped to the width of ``ax`` (about 0.55 em a character), so that a title is never cut."""
    import textwrap

    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    return textwrap.fill(text, max(12, int(width_pt / (0.55 * fontsize))), break_on_hyphens=False)


def comparison_figures(scores: Mapping[str, Mapping[str, Mapping[Any, float]]], comparison: pd.DataFrame,
                       baseline: str, *, alpha: float = 0.05, n_boot: int = 1000, seed: int = 0,
                       max_plots: int = 12, headline: Sequence[str] | None = None) -> dict[str, Any]:
    """One PNG-ready matplotlib figure per metric of :func:`plotted_metrics` (the ``headline`` metrics first, never
    capped; default :func:`headline_metrics` of the table): the metric as the figure's title; left, each variant's
    mean with its bootstrap interval; right, the per-row differences from the baseline with the mean difference and
    its interval and the Holm-adjusted p-value. Titles are wrapped to their plot's width. Returns ``file name ->
    figure``, in that order."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    figures: dict[str, Any] = {}
    variants = list(scores)
    if headline is None:
        headline = headline_metrics(list(dict.fromkeys(comparison["metric"])))
    for metric in plotted_metrics(comparison, headline, max_plots):
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.55 * len(variants) + 2.8))
        means, lows, highs, labels = [], [], [], []
        for v in variants:
            vals = np.array(list(scores[v].get(metric, {}).values()), dtype=float)
            if len(vals) == 0:
                continue
            lo, hi = _bootstrap_ci(vals, alpha, n_boot, seed) if len(vals) > 1 else (vals[0], vals[0])
            means.append(vals.mean())
            lows.append(max(0.0, vals.mean() - lo))
            highs.append(max(0.0, hi - vals.mean()))
            labels.append(_short(v) + (" (baseline)" if v == baseline else ""))
        ys = np.arange(len(labels))
        left.errorbar(means, ys, xerr=[lows, highs], fmt="o", capsize=4, color="#1f77b4")
        left.set_yticks(ys, labels, fontsize=8)
        left.invert_yaxis()
        sub = comparison[comparison["metric"] == metric]
        rng = np.random.default_rng(seed)
        others = [v for v in variants if v != baseline and v in set(sub["variant"])]
        for i, v in enumerate(others):
            x, y = _pair(scores[v][metric], scores[baseline][metric])
            d = x - y
            right.scatter(d, i + rng.uniform(-0.18, 0.18, len(d)), s=10, alpha=0.45, color="#7f7f7f")
            row = sub[sub["variant"] == v].iloc[0]
            if row["ci_low"] is not None:
                color = "#d62728" if row["significant"] else "#1f77b4"
                right.errorbar([row["mean_diff"]], [i], xerr=[[max(0.0, row["mean_diff"] - row["ci_low"])],
                                                                  [max(0.0, row["ci_high"] - row["mean_diff"])]],
                               fmt="D", capsize=5, color=color)
        right.axvline(0, color="black", linewidth=0.8)
        right.set_yticks(np.arange(len(others)), [
            f"{_short(v)}  p_holm={_fmt_p(sub[sub['variant'] == v].iloc[0]['p_holm'])}" for v in others], fontsize=8)
        right.invert_yaxis()
        fig.suptitle(_short(metric, 90), fontsize=11, fontweight="bold")
        with warnings.catch_warnings():  # very long variant names: matplotlib keeps the layout it can
            warnings.simplefilter("ignore")
            fig.tight_layout()
            for ax, title in ((left, f"mean by variant ({1 - alpha:.0%} bootstrap interval)"),
                              (right, f"per-row difference from the baseline {_short(baseline)} (red: significant)")):
                ax.set_title(_wrapped(title, ax, 9), fontsize=9)
            fig.tight_layout()  # again, for the wrapped titles' height
        figures[f"ragjudge/plots/{_safe_file(metric)}.png"] = fig
    return figures


def _short(name: str, limit: int = 48) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _fmt_p(p: Any) -> str:
    return "n/a" if p is None else f"{p:.3g}"


def log_comparison(run_id: str, comparison: pd.DataFrame, figures: Mapping[str, Any] | None = None) -> None:
    """Log the comparison table (``ragjudge/comparison.json``, an MLflow table; replacing one the run holds) and the
    figures into a run."""
    tracking.replace_table(run_id, comparison, COMPARISON_FILE)
    tracking.log_figures(run_id, dict(figures or {}))


# --------------------------------------------------------------------------- existing runs


def compare_runs(run_ids: Sequence[str] | Mapping[str, str], baseline: int | str = 0, *,
                 metrics: Sequence[str] | None = None, alpha: float = 0.05, n_boot: int = 2000, seed: int = 0,
                 log_to: str | None = None, plots: bool = True) -> pd.DataFrame:
    """The paired comparison of existing ``ragjudge`` runs (a list of run ids, named by their run names, or a
    mapping ``name -> run id``), against ``baseline`` (an index or a name). Rows are paired by position and must
    hold the same questions in every run. With ``log_to`` (a run id), the table and plots are logged there.

    Raises:
        ValueError: fewer than two runs, an unknown baseline, or runs over different questions.
    """
    if isinstance(run_ids, Mapping):
        named = dict(run_ids)
    else:
        named = {}
        for rid in run_ids:
            name = tracking.run_name(rid)
            named[name if name not in named else f"{name} ({rid[:8]})"] = rid
    if len(named) < 2:
        raise ValueError("compare_runs needs at least two runs")
    names = list(named)
    base = names[baseline] if isinstance(baseline, int) else baseline
    if base not in named:
        raise ValueError(f"baseline {baseline!r} is not one of {names}")
    outputs = {n: load_output(rid) for n, rid in named.items()}
    questions = {n: o.table["question"].tolist() for n, o in outputs.items()}
    ref = questions[base]
    for n, q in questions.items():
        if q != ref:
            raise ValueError(f"run {n!r} ({named[n]}) was evaluated on other rows than {base!r}: a paired comparison "
                             "needs the same questions in the same order in every run")
    scores = {n: scores_by_row(o.results) for n, o in outputs.items()}
    table = paired_comparison(scores, base, metrics=metrics, alpha=alpha, n_boot=n_boot, seed=seed)
    if log_to is not None:
        figures = comparison_figures(scores, table, base, alpha=alpha, seed=seed) if plots else {}
        log_comparison(log_to, table, figures)
    return table

