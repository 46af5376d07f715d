"""Pin reference values from ``ppi_py`` (package ppi-python) for ``tests/test_ppi.py``.

Generates deterministic synthetic cases (seeded numpy) and writes ``tests/data/ppi_reference.json``: for each case
the per-row arrays (``null`` where a value is missing) and what ``ppi_py.ppi_mean_ci`` and
``ppi_py.ppi_mean_pointestimate`` give on them, with the λ that PPI++ picks when ``lam`` is None (computed as ppi_py
does, by ``ppi_py.ppi._calc_lam_glm`` at the plain-PPI point estimate).

ppi_py is given only the rows with a judge score: rows the judge did not score are left out of both the labelled
and the unlabelled set, whether or not they carry a label. Paired cases (variants A and B judged on the same rows)
are pinned as ppi_py on the per-row differences: a row is scored when both judges scored it and labelled when both
humans labelled it.

Run from the repository root (needs ppi-python, a dev dependency)::

    .venv/bin/python scripts/pin_ppi_reference.py
"""

from __future__ import annotations

import json
import math
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import ppi_py
from ppi_py.ppi import _calc_lam_glm

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "ppi_reference.json"


# ---------------------------------------------------------------------------------------------
# synthetic data: true human values and a judge of a given quality
# ---------------------------------------------------------------------------------------------


def _truth(rng: np.random.Generator, kind: str, m: int) -> np.ndarray:
    if kind == "binary":
        return (rng.random(m) < 0.62).astype(float)
    if kind == "likert":  # 1..5, skewed towards the top like most quality ratings
        return rng.choice([1.0, 2.0, 3.0, 4.0, 5.0], size=m, p=[0.08, 0.12, 0.2, 0.32, 0.28])
    raise ValueError(kind)


def _judge(rng: np.random.Generator, kind: str, quality: str, y: np.ndarray) -> np.ndarray:
    m = len(y)
    if kind == "binary":
        if quality == "good":  # agrees with the human 95% of the time
            return np.where(rng.random(m) < 0.05, 1 - y, y)
        if quality == "biased":  # says "yes" too easily
            return (rng.random(m) < np.where(y == 1, 0.95, 0.45)).astype(float)
        if quality == "random":
            return (rng.random(m) < 0.5).astype(float)
        if quality == "adversarial":  # mostly the opposite of the human: PPI++ clips λ to 0
            return np.where(rng.random(m) < 0.85, 1 - y, y)
        if quality == "probability":  # a continuous score in [0, 1] (e.g. a judge's probability of "yes")
            return np.round(np.clip(0.25 + 0.5 * y + rng.normal(0, 0.18, m), 0, 1), 2)
    if kind == "likert":
        if quality == "good":  # off by one now and then
            return np.clip(y + rng.choice([-1.0, 0.0, 1.0], size=m, p=[0.1, 0.8, 0.1]), 1, 5)
        if quality == "biased":  # lenient: one point high most of the time
            return np.clip(y + rng.choice([0.0, 1.0, 2.0], size=m, p=[0.25, 0.6, 0.15]), 1, 5)
        if quality == "random":
            return rng.integers(1, 6, size=m).astype(float)
    raise ValueError(f"{kind}/{quality}")


def _layout(rng: np.random.Generator, n: int, big_n: int, n_excl: int, n_excl_lab: int) -> dict[str, np.ndarray]:
    """Boolean masks over ``n + big_n + n_excl`` shuffled rows: scored & labelled, scored & unlabelled, not scored
    (``n_excl_lab`` of those labelled)."""
    m = n + big_n + n_excl
    role = np.r_[np.zeros(n), np.ones(big_n), np.full(n_excl_lab, 2), np.full(n_excl - n_excl_lab, 3)]
    role = role[rng.permutation(m)]
    return {"scored": role <= 1, "labelled": (role == 0) | (role == 2)}


def _reference(y: np.ndarray, yhat: np.ndarray, yhat_u: np.ndarray, alpha: float, lam: float | None) -> dict[str, Any]:
    low, high = ppi_py.ppi_mean_ci(y, yhat, yhat_u, alpha=alpha, lam=lam)
    point = ppi_py.ppi_mean_pointestimate(y, yhat, yhat_u, lam=lam)
    out: dict[str, Any] = {"ci_low": float(np.ravel(low)[0]), "ci_high": float(np.ravel(high)[0]),
                           "mean": float(np.ravel(point)[0])}
    if lam is None:  # as ppi_mean_ci does it: gradients at the plain-PPI point estimate, λ clipped to [0, 1]
        theta1 = ppi_py.ppi_mean_pointestimate(y, yhat, yhat_u, lam=1)
        y2, yh2, yu2 = y[:, None], yhat[:, None], yhat_u[:, None]
        out["lam"] = float(_calc_lam_glm(y2 - theta1, yh2 - theta1, yu2 - theta1, np.eye(1), clip=True))
        again = ppi_py.ppi_mean_ci(y, yhat, yhat_u, alpha=alpha, lam=out["lam"])
        assert np.allclose(np.ravel(again), [out["ci_low"], out["ci_high"]], rtol=0, atol=1e-12), "λ not reproduced"
    else:
        out["lam"] = float(lam)
    return out


def _json_array(a: np.ndarray) -> list[float | int | None]:
    return [None if math.isnan(v) else (int(v) if float(v).is_integer() else float(v)) for v in a.tolist()]


# ---------------------------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------------------------

ALPHAS = (0.05, 0.1, 0.2)
NS = (30, 60, 150)
BIG_NS = (200, 350, 600)


def mean_cases() -> list[dict[str, Any]]:
    specs: list[tuple[str, str, float | None]] = []
    for kind in ("binary", "likert"):
        for quality in ("good", "biased", "random"):
            for lam in (None, 1.0):
                specs.append((kind, quality, lam))
    specs += [("binary", "biased", 0.5), ("likert", "good", 0.0), ("binary", "adversarial", None),
              ("binary", "probability", None), ("binary", "probability", 1.0)]
    cases = []
    for i, (kind, quality, lam) in enumerate(specs):
        rng = np.random.default_rng(1000 + i)
        alpha, n, big_n = ALPHAS[i % 3], NS[(i // 3) % 3], BIG_NS[i % 3]
        n_excl, n_excl_lab = 4 + i % 5, 1 + i % 3
        lay = _layout(rng, n, big_n, n_excl, n_excl_lab)
        y = _truth(rng, kind, len(lay["scored"]))
        judge = _judge(rng, kind, quality, y)
        judge[~lay["scored"]] = np.nan
        human = np.where(lay["labelled"], y, np.nan)
        sl, su = lay["scored"] & lay["labelled"], lay["scored"] & ~lay["labelled"]
        cases.append({
            "name": f"{kind}-{quality}-lam{lam}-a{alpha}-n{n}-N{big_n}", "alpha": alpha, "lam": lam,
            "n_labelled": n, "n_unlabelled": big_n, "n_excluded": n_excl, "n_excluded_labelled": n_excl_lab,
            "judge": _json_array(judge), "human": _json_array(human),
            "ppi_py": _reference(human[sl], judge[sl], judge[su], alpha, lam),
        })
    return cases


def paired_cases() -> list[dict[str, Any]]:
    specs: list[tuple[str, str, float | None]] = [
        ("binary", "good", None), ("binary", "biased", 1.0), ("likert", "good", None),
        ("likert", "biased", 0.5), ("binary", "random", None), ("likert", "good", 1.0)]
    cases = []
    for i, (kind, quality, lam) in enumerate(specs):
        rng = np.random.default_rng(2000 + i)
        alpha, m = ALPHAS[i % 3], (260, 420, 700)[i % 3]
        # A and B answer the same questions: B is a little worse, and the two are correlated through the row
        ya = _truth(rng, kind, m)
        worse = rng.random(m) < 0.25
        yb = np.where(worse, np.maximum(ya - 1, 0 if kind == "binary" else 1), ya)
        yb = np.where(rng.random(m) < 0.1, _truth(rng, kind, m), yb)
        ja, jb = _judge(rng, kind, quality, ya), _judge(rng, kind, quality, yb)
        ja[rng.random(m) < 0.03] = np.nan  # the judge failed on a few answers, on either side
        jb[rng.random(m) < 0.03] = np.nan
        lab = np.zeros(m, dtype=bool)
        lab[rng.choice(m, size=NS[i % 3] + 8, replace=False)] = True
        only_one = rng.random(m) < 0.04  # a few rows labelled on one side only: unlabelled for the difference
        ha = np.where(lab | (only_one & (rng.random(m) < 0.5)), ya, np.nan)
        hb = np.where(lab & ~only_one, yb, np.nan)
        d_judge, d_human = ja - jb, ha - hb
        scored = ~np.isnan(d_judge)
        sl, su = scored & ~np.isnan(d_human), scored & np.isnan(d_human)
        cases.append({
            "name": f"paired-{kind}-{quality}-lam{lam}-a{alpha}-M{m}", "alpha": alpha, "lam": lam,
            "n_labelled": int(sl.sum()), "n_unlabelled": int(su.sum()), "n_excluded": int((~scored).sum()),
            "n_excluded_labelled": int((~scored & ~np.isnan(d_human)).sum()),
            "judge_a": _json_array(ja), "judge_b": _json_array(jb),
            "human_a": _json_array(ha), "human_b": _json_array(hb),
            "ppi_py": _reference(d_human[sl], d_judge[sl], d_judge[su], alpha, lam),
        })
    return cases


def main() -> None:
    data = {
        "about": "Reference values from ppi_py.ppi_mean_ci / ppi_mean_pointestimate (ppi-python "
                 f"{version('ppi-python')}), written by scripts/pin_ppi_reference.py; "
                 "null: no value (judge gave no score / row not labelled).",
        "mean": mean_cases(),
        "paired_diff": paired_cases(),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size // 1024} KB): {len(data['mean'])} mean cases, "
          f"{len(data['paired_diff'])} paired cases")


if __name__ == "__main__":
    main()
