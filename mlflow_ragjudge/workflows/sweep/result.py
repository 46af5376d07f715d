"""What a sweep produced, and its summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ...core.constants import is_offline_judge
from ...engine.evaluate import EvalOutput
from ..calibration import calibrate, label_sample


@dataclass
class SweepResult:
    """What a sweep produced.

    Attributes:
        parent_run_id: the parent run (the comparison and plots are there).
        run_ids: variant name -> child run id.
        comparison: the paired comparison (:data:`mlflow_ragjudge.workflows.compare.COLUMNS`).
        baseline: the baseline variant's name.
        variants: variant name -> its parameters as recorded (a prompt as ``name@v<version>``).
        outputs: variant name -> its evaluation (:class:`EvalOutput`), None for a variant with no answer at all.
        generation: variant name -> ``{"rows", "generated", "cached", "failed", "seconds"}``.
        prompts: variant name -> parameter -> ``prompts:/<name>/<version>``.
        errors: variant name -> why its answers could not be evaluated (e.g. a metric asked for by name whose
            column this variant's pipeline output lacks); the sweep goes on without it.
        generation_failures: variant name -> why it counts as failed: the pipeline raised on more than
            ``max_error_rate`` of its questions (every question, at worst); ``ragjudge sweep`` exits 3.
    """

    parent_run_id: str
    run_ids: dict[str, str]
    comparison: pd.DataFrame
    baseline: str
    variants: dict[str, dict[str, Any]]
    outputs: dict[str, EvalOutput | None] = field(default_factory=dict)
    generation: dict[str, dict[str, Any]] = field(default_factory=dict)
    prompts: dict[str, dict[str, str]] = field(default_factory=dict)
    #: variant name -> why its answers could not be evaluated (its child run says so too)
    errors: dict[str, str] = field(default_factory=dict)
    #: variant name -> the pipeline failed on more than max_error_rate of its questions: how many, the first error
    generation_failures: dict[str, str] = field(default_factory=dict)
    #: the signal that stopped the sweep (``SIGINT``, ``SIGTERM``), or None: the variants not reached have no run,
    #: the one under way logged what it had, and the parent and that child ended KILLED
    stopped: str | None = None

    def summary(self, headline: Sequence[str] = ("correctness", "faithfulness", "context_recall", "map")) -> str:
        """The sweep's outcome as text: each variant's run and headline means, the metrics skipped, then the
        comparison (the smallest p-values first)."""
        result = self
        lines = [f"sweep: parent run {result.parent_run_id}, baseline {result.baseline!r}"]
        offline = any(out is not None and is_offline_judge(out.params.get("ragjudge.judge"))
                      for out in result.outputs.values())
        shown = [h for h in headline if any(out is not None and f"{h}/mean" in out.metrics
                                            for out in result.outputs.values())]
        for name, run_id in result.run_ids.items():
            out = result.outputs.get(name)
            gen = result.generation.get(name, {})
            means = "  ".join(f"{h}={out.metrics[f'{h}/mean']:.3f}" for h in shown
                              if out is not None and f"{h}/mean" in out.metrics)
            lines.append(f"  {name:<40} run {run_id[:8]}  {means}  (answers: {gen.get('generated', 0)} generated, "
                         f"{gen.get('cached', 0)} cached, {gen.get('failed', 0)} failed)")
        for name, why in result.errors.items():
            lines.append(f"  NOT EVALUATED {name}: {why[:300]}")
        for name, why in result.generation_failures.items():
            lines.append(f"  GENERATION FAILED {name}: {why}")
        base_out = result.outputs.get(result.baseline)
        for metric, reason in (base_out.skipped.items() if base_out is not None else ()):
            lines.append(f"  skipped {metric}: {reason}")
        table = result.comparison
        if len(table):
            lines.append(f"comparison against {result.baseline!r} (paired, per metric; Holm-corrected over "
                         f"{len(table)} comparisons):")
            moved = table[table["mean_diff"].map(lambda d: d is not None and d != 0)]
            order = moved.assign(_p=moved["p_value"].map(lambda p: 2.0 if p is None else p),
                                 _d=moved["mean_diff"].map(lambda d: -abs(d))).sort_values(["_p", "_d"])
            for _, r in order.head(12).iterrows():
                ci = f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]" if r["ci_low"] is not None else "[n/a]"
                p = "n/a" if r["p_holm"] is None else f"{r['p_holm']:.3g}"
                mark = "  SIGNIFICANT" if r["significant"] else ""
                lines.append(f"  {r['metric']:<22} {r['variant']:<36} diff {r['mean_diff']:+.3f} {ci} {_decision(r)}"
                             f"  p_holm {p}  w/t/l {r['wins']}/{r['ties']}/{r['losses']}  n={r['n']}{mark}")
            if len(moved) > 12:
                lines.append(f"  ... {len(moved) - 12} more with a difference")
            if len(table) > len(moved):
                lines.append(f"  {len(table) - len(moved)} comparison(s) with no difference at all")
            if "decision" in table.columns:
                told = table["decision"].value_counts()
                lines.append(f"  on the interval of each difference: {int(told.get('better', 0))} better, "
                             f"{int(told.get('worse', 0))} worse, {int(told.get('undecided', 0))} undecided "
                             "(one comparison at a time; SIGNIFICANT corrects for them all)")
            n_sig = int(sum(bool(v) for v in table["significant"]))
            lines.append(f"  {n_sig} significant difference(s) at alpha 0.05 after Holm's correction; all rows in "
                         "ragjudge/comparison.json on the parent run")
            smallest = min((int(n) for n in table["n"]), default=0)
            if n_sig == 0 and smallest < 30:
                lines.append(f"  (with {smallest} paired rows per comparison only large, consistent differences can "
                             "be significant: more questions give the test its power)")
        if offline:
            lines.append("judged numbers are offline estimates (offline:/lexical, not an LLM); for LLM judgements "
                         "pass --judge openai:/gpt-4o-mini or any judge URI")
        return "\n".join(lines)

    def decided(self, which: str = "better") -> pd.DataFrame:
        """The rows of the comparison whose ``decision`` is ``which`` (``better``, ``worse`` or ``undecided``: the
        interval of the difference, :func:`mlflow_ragjudge.workflows.compare.decision`)."""
        return self.comparison[self.comparison["decision"] == which]

    def label_sample(self, n: int = 100, **kwargs: Any) -> pd.DataFrame:
        """A seeded random sample of the sweep's questions, in every variant, to label blind
        (:func:`mlflow_ragjudge.workflows.calibration.label_sample` on the parent run)."""
        return label_sample(self.parent_run_id, n, **kwargs)

    def calibrate(self, labels: Any, **kwargs: Any) -> Any:
        """Calibrated estimates per variant and calibrated differences against the baseline, from filled labels
        (:func:`mlflow_ragjudge.workflows.calibration.calibrate` on the parent run); ``self.comparison`` gains the
        columns."""
        result = calibrate(self.parent_run_id, labels, **kwargs)
        if result.comparison is not None:
            self.comparison = result.comparison
        return result

    def significant(self) -> pd.DataFrame:
        """The rows of the comparison whose difference is significant after Holm's correction."""
        return self.comparison[self.comparison["significant"] == True]  # noqa: E712 (object column)


def _decision(r: Any) -> str:
    """A comparison row's decision as the summary shows it: ``BETTER``, ``WORSE``, or ``undecided`` with about how
    many more paired rows would decide it."""
    d = r.get("decision")
    if d in ("better", "worse"):
        return f"{d.upper():<9}"
    more = r.get("more_rows")
    return "undecided" + (f" (~{more} more rows)" if more is not None else "")
