"""How well repeats measure a judge's noise, and what repeats, panels and the cascade cost -- docs/judge-noise.md.

Run by hand (offline; no key, no network; about two minutes on two cores)::

    python benchmarks/judge_noise.py            # 20 seeds per setting
    python benchmarks/judge_noise.py --seeds 5  # quicker

What is measured. The judge is the tests' noisy model (tests/noisy_model.py): the independent schema-following model
whose level for a row is its "true" level, or with probability ``p`` per draw another one, answering in-process (no
socket). For each flip probability and each seed (the model's ``salt``: other pseudo-random draws), 200 rows are
judged for correctness with ``repeats=3``, and the script records whether the run's 95 % intervals of the flip rate
and of the judge's variance contain the truth (``1 - (1-p)^3 - p^3``, and the mean of ``p (1-p) (true - other)^2``
over the rows): their coverage. Then the cost of each way to handle the noise on the same rows: requests per row with
one judge, repeats 3 and 5, a panel of three judges, and the cascade (``escalate_to``, rows whose two draws disagree
sent to a second judge).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from inprocess import CompliantBackend  # noqa: E402
from noisy_model import NoisyModel  # noqa: E402

from mlflow_ragjudge import evaluate_frame  # noqa: E402


class NoisyBackend(CompliantBackend):
    """The noisy model, in-process (:class:`~inprocess.CompliantBackend`'s wiring, the noisy model's answers)."""

    def __init__(self, p: float, salt: str, model: str = "noisy") -> None:
        super().__init__(model=model)
        self._model = NoisyModel(p, values=[1, 2, 3, 4, 5], salt=salt)


def _rows(n: int) -> pd.DataFrame:
    return pd.DataFrame({"question": [f"What does unit {i} store?" for i in range(n)],
                         "answer": [f"Unit {i} stores reports for {i % 5 + 1} days." for i in range(n)],
                         "reference": [f"Unit {i} stores reports." for i in range(n)]})


def _run(df: pd.DataFrame, judge, **cfg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return evaluate_frame(df, judge=judge, metrics=["correctness"], context_mode="none", cache=False,
                              progress=False, **cfg)


def coverage(seeds: int, rows: int = 200, repeats: int = 3) -> list[dict]:
    lines = []
    for p in (0.1, 0.3):
        hit_flip = hit_var = 0
        flips, truth_flip = [], 1 - (1 - p) ** repeats - p ** repeats
        for s in range(seeds):
            backend = NoisyBackend(p, salt=f"seed{s}")
            m = _run(_rows(rows), backend, repeats=repeats).metrics
            pairs = [v["score"] for v in backend._model.pairs.values()]
            truth_var = sum(p * (1 - p) * (a - b) ** 2 for a, b in pairs) / len(pairs)
            hit_flip += m["correctness/flip_rate_ci_low"] <= truth_flip <= m["correctness/flip_rate_ci_high"]
            hit_var += m["correctness/judge_variance_ci_low"] <= truth_var <= m["correctness/judge_variance_ci_high"]
            flips.append(m["correctness/flip_rate"])
        lines.append({"p": p, "seeds": seeds, "true flip rate": round(truth_flip, 3),
                      "mean measured": round(sum(flips) / len(flips), 3),
                      "flip-rate interval coverage": f"{hit_flip}/{seeds}",
                      "judge-variance interval coverage": f"{hit_var}/{seeds}"})
    return lines


def costs(rows: int = 200, p: float = 0.2) -> list[dict]:
    df = _rows(rows)
    out = []

    def line(what: str, o, note: str = "") -> None:
        m = o.metrics
        out.append({"setting": what, "requests per row": round(m["judge/correctness/requests"] / rows, 2),
                    "input tokens per row": round(m["judge/input_tokens"] / rows),
                    "flip rate": round(m["correctness/flip_rate"], 3) if "correctness/flip_rate" in m else "-",
                    "note": note})

    line("one judge", _run(df, NoisyBackend(p, "c")))
    line("repeats=3", _run(df, NoisyBackend(p, "c"), repeats=3))
    line("repeats=5", _run(df, NoisyBackend(p, "c"), repeats=5))
    panel = [NoisyBackend(p, "c", "j1"), NoisyBackend(p, "d", "j2"), NoisyBackend(p, "e", "j3")]
    o = _run(df, panel)
    line("panel of 3 judges", o, f"Fleiss kappa {o.metrics['correctness/panel/fleiss_kappa']:.3f}")
    o = _run(df, NoisyBackend(p, "c", "cheap"), repeats=2, escalate_to=NoisyBackend(p / 4, "s", "strong"),
             escalate_when=["spread", "abstain"])
    esc = o.metrics["correctness/escalated"]
    line("cascade: repeats=2, rows whose draws disagree to a second judge (x2)", o,
         f"{esc:.0f} of {rows} rows escalated; {o.metrics['judge/escalation/requests_saved']:.0f} second-judge "
         "requests not sent")
    return out


def _markdown(lines: list[dict]) -> str:
    cols = list(lines[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(line[c]) for c in cols) + " |" for line in lines]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    print(_markdown(coverage(args.seeds)))
    print()
    print(_markdown(costs()))


if __name__ == "__main__":
    main()
