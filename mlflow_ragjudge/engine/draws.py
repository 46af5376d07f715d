"""Step 3 with more than one verdict per row: repeated draws of a judge (``repeats``), a panel of judges
(``judge=[...]``) and the cheap-first cascade (``escalate_to``) -- docs/judge-noise.md.

Every judged metric is scored once per *draw*: each judge of the panel, ``repeats`` times, each time through a view of
the judge's client that sends the requests as that draw (:meth:`~mlflow_ragjudge.llm.client.JudgeClient.for_draw`:
its own seed, its own cache entries). The metrics that call no judge are scored once. A row's draws are then combined
into the one result the rest of the run reads (:func:`combine`, by ``panel_rule``), so the run's means, intervals,
gates, tables and traces need nothing new; the draws themselves are kept (:class:`Draws`) for the judge-noise
statistics (:mod:`.noise`), each judge's own columns and the panel's agreement.

The draws run one after the other, each with the whole of step 3's concurrency (:func:`.schedule.schedule`); the
cascade's second judge then scores only the rows its first judge was unsure about.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from ..core.types import FailureReason, JudgeResult, Row, Status
from ..llm.client import JudgeClient
from ..metrics.spec import MetricSpec
from .prepare import Plan, setup_metrics
from .schedule import by_output, schedule
from .select import gate_metric_name
from .validate import Checked

__all__ = ["Draws", "schedule_draws", "combine", "combine_draws", "combined_value", "has_draws", "rule_for",
           "on_levels", "spread", "read_draws"]

PerRow = dict[str, list[dict[str, JudgeResult]]]


@dataclass
class Draws:
    """Every draw's per-row results of a run with repeats, a panel or a cascade.

    Attributes:
        judges: the judges' labels, in order (the cascade's second judge last).
        repeats: draws per judge.
        rule: how draws and judges were combined (``panel_rule`` as given).
        results: output name -> per row -> per judge -> that judge's draws' results (empty: the judge did not
            score the row: the cascade's second judge on a row it was not sent).
        levels: the outputs on the six-level scale (combined by majority under ``auto``).
        escalated: metric -> the rows (positions) its cascade sent to the second judge.
        cascade: whether the last judge is the cascade's second judge (not a panel member).
    """

    judges: list[str]
    repeats: int
    rule: str
    results: dict[str, list[list[list[JudgeResult]]]] = field(default_factory=dict)
    levels: frozenset[str] = frozenset()
    escalated: dict[str, list[int]] = field(default_factory=dict)
    cascade: bool = False
    #: the judged metrics' states of the first judge's first draw: what their ``finish``, ``record`` and ``params``
    #: hooks read (multi-turn's conversations: those of that draw)
    states: dict[str, Any] = field(default_factory=dict)

    def rule_for(self, output: str) -> str:
        """The combination rule of one output: ``auto`` is majority on the six-level outputs, mean elsewhere."""
        return rule_for(self.rule, output, self.levels)

    def on_levels(self, output: str) -> bool:
        """Whether an output is on the six-level scale (a level name, or one ending in ``_``: a prefix)."""
        return on_levels(output, self.levels)

    def judge_values(self, output: str, judge: int) -> list[float | None]:
        """One judge's own per-row value of an output (its draws combined), None where it did not score."""
        rule = self.rule_for(output)
        return [combined_value(_scored(per_judge[judge]), rule) if per_judge[judge] else None
                for per_judge in self.results[output]]

    def draw_values(self, output: str) -> list[list[float | None]]:
        """Per row, every draw's value (judge-major; None where a draw did not score, nothing where a judge was not
        asked)."""
        return [[r.value if r.status is Status.SCORED else None for rs in per_judge for r in rs]
                for per_judge in self.results[output]]


def on_levels(output: str, levels: Sequence[str] | frozenset[str]) -> bool:
    """Whether an output is on the six-level scale: one of a metric's ``outputs.levels`` (a name, or a prefix ending
    in ``_``)."""
    return any(output == lv or (lv.endswith("_") and output.startswith(lv)) for lv in levels)


def rule_for(rule: str, output: str, levels: Sequence[str] | frozenset[str]) -> str:
    """The combination rule of one output under ``panel_rule=rule``: ``auto`` is majority on the six-level outputs
    (a level stays a level), mean elsewhere."""
    if rule != "auto":
        return rule
    return "majority" if on_levels(output, levels) else "mean"


def combine_draws(per_draw: Sequence[dict[str, JudgeResult]], rule: str, levels: Sequence[str]
                  ) -> dict[str, JudgeResult]:
    """One row's results of several draws (each ``output -> result``) combined per output (:func:`combine`), each
    combined result's ``details`` also holding ``draws`` (every draw's value, None where it did not score) and
    ``spread`` (their standard deviation): what the ``mlflow.genai`` scorers give a row with ``repeats``."""
    out: dict[str, JudgeResult] = {}
    for name in dict.fromkeys(n for d in per_draw for n in d):
        results = [d[name] for d in per_draw if name in d]
        row = combine(results, rule_for(rule, name, levels))
        values = [r.value if r.status is Status.SCORED else None for r in results]
        row.details = {**row.details, "draws": values, "spread": spread([float(v) for v in values if v is not None])}
        out[name] = row
    return out


def read_draws(cell: Any, record: dict[str, Any] | None = None) -> list[Any] | None:
    """One ``<output>/draws`` cell of a run's per-row table as a list (it is JSON text in a logged table); None when
    it holds no list. With the run's ``draws`` record (``EvalOutput.config["draws"]``) of a panel or a cascade, only
    the first judge's draws: the cell lists them judge by judge, ``repeats`` each, and another judge's values differ
    by more than that judge's noise."""
    if isinstance(cell, str):
        try:
            cell = json.loads(cell)
        except ValueError:
            return None
    if not isinstance(cell, (list, tuple)) and not hasattr(cell, "tolist"):
        return None
    values = list(cell.tolist() if hasattr(cell, "tolist") else cell)
    record = record or {}
    if len(record.get("judges") or ()) > 1 and record.get("repeats"):
        values = values[: int(record["repeats"])]
    return values


def spread(values: Sequence[float]) -> float | None:
    """The sample standard deviation of a row's scored draws (None for fewer than two)."""
    if len(values) < 2:
        return None
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def has_draws(checked: Checked) -> bool:
    """Whether the run scores its rows more than once (repeats, a panel or a cascade)."""
    cfg = checked.cfg
    return cfg.repeats > 1 or bool(cfg.panel) or cfg.escalate_to is not None


def _scored(results: Sequence[JudgeResult]) -> list[float]:
    return [float(r.value) for r in results if r.status is Status.SCORED and r.value is not None]


def combined_value(values: Sequence[float], rule: str) -> float | None:
    """The values of one row's draws (or judges) combined by ``rule``: ``mean``; ``median`` (of an even count, the
    mean of the two middle values); ``majority``: the most frequent value, a tie broken by the value nearest the mean,
    then by the lower (conservative under a ``fail_under`` gate) -- so a level stays a level. None for no values."""
    if not values:
        return None
    if rule == "mean":
        return math.fsum(values) / len(values)
    if rule == "median":
        return float(median(values))
    counts = Counter(values)
    top = max(counts.values())
    tied = sorted(v for v, c in counts.items() if c == top)
    if len(tied) == 1:
        return tied[0]
    mean = math.fsum(values) / len(values)
    return min(tied, key=lambda v: (abs(v - mean), v))


def combine(results: Sequence[JudgeResult], rule: str, what: str = "draws") -> JudgeResult:
    """One row's draws as one result: scored when any draw scored, its value the scored draws' combination (an
    abstaining or failed draw is left out, as a run's mean leaves out an abstaining row), its evidence the scored
    draw nearest that value; else the first abstention, else the first failure. A draw that a stop (Ctrl-C, SIGTERM)
    left unjudged fails the row ``interrupted``, as a row of one draw would. Every draw's calls are kept."""
    calls = [c for r in results for c in r.calls]
    stopped = next((r for r in results if r.reason == FailureReason.INTERRUPTED.value), None)
    if stopped is not None:  # a draw the stop left unjudged: the row is not judged yet (a re-run finishes it)
        return JudgeResult(Status.FAILED, None, stopped.rationale, stopped.reason, None, {}, calls)
    values = _scored(results)
    value = combined_value(values, rule)
    if value is not None:
        scored = [r for r in results if r.status is Status.SCORED and r.value is not None]
        rep = min(scored, key=lambda r: abs(float(r.value or 0.0) - value))
        agree = sum(1 for v in values if v == value)
        note = f" [{agree} of {len(results)} {what} gave {value:g}]" if len(results) > 1 else ""
        return JudgeResult(Status.SCORED, value, rep.rationale + note, None, rep.raw, rep.details, calls)
    rep = next((r for r in results if r.status is Status.ABSTAINED), results[0])
    return JudgeResult(rep.status, None, rep.rationale, rep.reason, rep.raw, rep.details, calls)


def _labelled(results: dict[str, list[JudgeResult]], judge: str) -> dict[str, list[JudgeResult]]:
    """Each call record of the results names its judge (the draw is named by the client)."""
    for res in results.values():
        for r in res:
            for call in r.calls:
                call.setdefault("judge", judge)
    return results


def _draw(checked: Checked, plan: Plan, specs: Sequence[MetricSpec], client: JudgeClient, label: str,
          rows: Sequence[Row], keep: dict[str, Any] | None = None) -> dict[str, dict[str, list[JudgeResult]]]:
    """One draw: the metrics' states built around ``client`` (a draw's view of one judge; kept in ``keep`` when
    given), then step 3 on ``rows``; metric -> output -> per-row results."""
    ctx = plan.ctx.for_client(client, plan.prepared)
    states, _, _ = setup_metrics(specs, ctx, asked=True)
    if keep is not None:
        keep.update(states)
    per_row = schedule(specs, states, rows, ctx)
    return {s.name: _labelled(by_output(s, per_row[s.name]), label) for s in specs}


def schedule_draws(checked: Checked, plan: Plan) -> tuple[PerRow, Draws]:
    """Step 3 for a run with repeats, a panel or a cascade: the judged metrics once per draw of every judge (the
    cascade's second judge on the rows it is sent), the others once; returns the per-row results combined, as
    :func:`.schedule.schedule` returns them, and the draws."""
    cfg, rows = checked.cfg, checked.rows
    judged = [s for s in plan.specs if s.judged]
    plain = [s for s in plan.specs if not s.judged]
    out: PerRow = schedule(plain, plan.states, rows, plan.ctx) if plain else {}
    cascade = cfg.escalate_to is not None
    panel = plan.judges[:-1] if cascade else plan.judges
    draws = Draws([label for label, _ in plan.judges], cfg.repeats, cfg.panel_rule, cascade=cascade,
                  levels=frozenset(name for s in judged for name in s.outputs.levels))
    names: dict[str, list[str]] = {}
    for j, (label, client) in enumerate(panel):
        for k in range(cfg.repeats):
            got = _draw(checked, plan, judged, client.for_draw(k, cfg.repeat_temperature), label, rows,
                        draws.states if j == k == 0 else None)
            for spec in judged:
                for name, res in got[spec.name].items():
                    if name not in draws.results:
                        names.setdefault(spec.name, []).append(name)
                        draws.results[name] = [[[] for _ in plan.judges] for _ in rows]
                    for i, r in enumerate(res):
                        draws.results[name][i][j].append(r)
    if cascade:
        _escalate(checked, plan, judged, names, draws)
    for spec in judged:
        out[spec.name] = [{} for _ in rows]
        escalated = set(draws.escalated.get(spec.name, ()))
        for name in names.get(spec.name, []):
            for i, per_judge in enumerate(draws.results[name]):
                out[spec.name][i][name] = _row_result(draws, name, per_judge, i in escalated)
    return out, draws


def _row_result(draws: Draws, name: str, per_judge: list[list[JudgeResult]], escalated: bool) -> JudgeResult:
    """A row's one result: a panel's judges each combined, then combined together; a cascade's second judge's
    verdict where the row was escalated (every call of both judges kept)."""
    rule = draws.rule_for(name)
    if draws.cascade:
        first, second = per_judge[0], per_judge[-1]
        by_second = escalated and bool(second)
        chosen = combine(second if by_second else first, rule)
        chosen.calls = [c for r in (*first, *second) for c in r.calls]
        chosen.details = {**chosen.details, "judge": draws.judges[-1 if by_second else 0]}
        return chosen
    each = [combine(rs, rule) for rs in per_judge if rs]
    if len(each) == 1:
        return each[0]
    panel = combine(each, rule, "judges")
    # the verdict's source (a trace's Feedback): the panel, whose judges each have a Feedback of their own
    panel.details = {**panel.details, "judge": "panel:" + ",".join(draws.judges)}
    return panel


def _escalate(checked: Checked, plan: Plan, judged: Sequence[MetricSpec], names: dict[str, list[str]],
              draws: Draws) -> None:
    """The cascade: each judged metric's rows its first judge was unsure about (``escalate_when``) scored again by
    the second judge, ``repeats`` times; the rows are recorded in ``draws.escalated``."""
    cfg, rows = checked.cfg, checked.rows
    label, client = plan.judges[-1]
    thresholds = _thresholds(cfg.fail_under)
    for spec in judged:
        unsure = sorted({i for name in names.get(spec.name, []) for i in _unsure_rows(
            draws, name, spec, cfg.escalate_when, thresholds.get(name))})
        draws.escalated[spec.name] = unsure
        if not unsure:
            continue
        for k in range(cfg.repeats):
            got = _draw(checked, plan, [spec], client.for_draw(k, cfg.repeat_temperature), label,
                        [rows[i] for i in unsure])
            for name, res in got[spec.name].items():
                if name not in draws.results:  # an output only the second judge gave
                    names.setdefault(spec.name, []).append(name)
                    draws.results[name] = [[[] for _ in plan.judges] for _ in rows]
                for i, r in zip(unsure, res):
                    draws.results[name][i][-1].append(r)


def _thresholds(fail_under: dict[str, float]) -> dict[str, float]:
    """The ``fail_under`` thresholds on an output's overall mean, by output name."""
    out: dict[str, float] = {}
    for raw, x in fail_under.items():
        key = gate_metric_name(raw)
        if key.endswith("/mean"):
            out[key[: -len("/mean")]] = float(x)
    return out


def _unsure_rows(draws: Draws, name: str, spec: MetricSpec, when: Sequence[str], threshold: float | None
                 ) -> list[int]:
    """The rows of one output the first judge is unsure about: it abstained on every draw (``abstain``), its draws
    disagree (``spread``), or its value sits at the output's ``fail_under`` threshold (``threshold``: within an
    eighth of the output's scale of it -- the levels either side of 3.5 on the six-level scale)."""
    lo, hi = spec.scale_of(name) or (0.0, 1.0)
    margin = (hi - lo) / 8
    out = []
    for i, per_judge in enumerate(draws.results[name]):
        first = per_judge[0]
        values = _scored(first)
        if "abstain" in when and first and not values and any(r.status is Status.ABSTAINED for r in first):
            out.append(i)
        elif "spread" in when and len(set(values)) > 1:
            out.append(i)
        elif "threshold" in when and threshold is not None and values:
            value = combined_value(values, draws.rule_for(name))
            if value is not None and abs(value - threshold) <= margin + 1e-12:
                out.append(i)
    return out


def draws_record(draws: Draws) -> dict[str, Any]:
    """What the run record says about its draws."""
    return {"judges": list(draws.judges), "repeats": draws.repeats, "panel_rule": draws.rule,
            "cascade": draws.cascade, "escalated": {m: len(rows) for m, rows in draws.escalated.items()}}
