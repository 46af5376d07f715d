"""What the commands share: the model flags read into the config, and a finished evaluation's summary and exit
code (``evaluate``, ``label-sample`` / ``calibrate`` / ``log-saved`` and ``sweep`` print and exit alike)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from ..core.constants import is_offline_judge
from .exits import EXIT_GATE_FAILED, EXIT_GATE_UNDECIDED, EXIT_JUDGE_FAILURES, EXIT_OK
from .parser import kv


def config_json(text: str | None) -> dict[str, Any]:
    """``--config``: a JSON object of evaluator settings (none: an empty one)."""
    try:
        cfg = json.loads(text) if text else {}
    except ValueError as e:
        raise ValueError(f"--config is not valid JSON ({e}); give a JSON object, e.g. "
                         "--config '{\"max_context_chars\": 8000}'") from None
    if not isinstance(cfg, dict):
        raise ValueError("--config must be a JSON object, e.g. --config '{\"max_context_chars\": 8000}'")
    return cfg


def numbers(items: list[str] | None, flag: str) -> dict[str, float]:
    """Repeated ``NAME=NUMBER`` flags (``--fail-under``, ``--max-drop``) as a dict, a bad number named."""
    out: dict[str, float] = {}
    for name, value in kv(items, flag).items():
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"{flag} {name}={value!r}: the value must be a number, e.g. {flag} {name}=0.5") from None
    return out


def judge_config(args: argparse.Namespace, cfg: dict[str, Any]) -> None:
    """``--judge`` (repeated: a panel) and the judge-noise flags (``--repeats`` ...), in cfg."""
    judges = getattr(args, "judge", None)
    if isinstance(judges, str):
        cfg["judge"] = judges
    elif judges:
        cfg["judge"] = judges[0] if len(judges) == 1 else list(judges)
    for flag in ("repeats", "repeat_temperature", "panel_rule", "escalate_to"):
        if getattr(args, flag, None) is not None:
            cfg[flag] = getattr(args, flag)  # a bad value is refused by the config check, naming it
    if getattr(args, "escalate_when", None):
        cfg["escalate_when"] = [w.strip() for w in args.escalate_when.split(",") if w.strip()]


def model_config(args: argparse.Namespace, cfg: dict[str, Any]) -> None:
    """The flags about the models beside the judge (``--embeddings``, ``--bertscore``) and ``--traces``, in cfg."""
    if getattr(args, "embeddings", None):
        cfg["embeddings"] = args.embeddings
    if getattr(args, "bertscore", False):
        cfg["bertscore"] = True
    if getattr(args, "traces", None) is not None:
        cfg["traces"] = args.traces  # a negative number is refused by the config check


_AT_K = re.compile(r"_at_(\d+)/")


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.4f}"


def summary(run_id: str, out: Any) -> str:
    """The headline first: each judged metric's mean, count, error and abstain rates; then the metrics
    that need no judge (retrieval @k only at the middle cut-off); judge bookkeeping last."""

    m = out.metrics
    lines = [f"rows: {out.config['rows']}   metrics: {', '.join(out.config['metrics_run'])}"]
    offline = is_offline_judge(out.params.get("ragjudge.judge"))
    if offline:
        held = (out.config.get("judge") or {}).get("held_out") or {}
        nq = held.get("nq301") or {}
        lines.append(
            f"judge: {out.params['ragjudge.judge']} -- the OFFLINE judge (calibrated lexical evidence, not an LLM): "
            "the judged numbers below are offline estimates"
            + (f" (held-out agreement with humans: {nq['agreement']:.1%} on NQ301, Spearman "
               f"{held['mtrag_faithfulness_spearman']:.2f} with MTRAG faithfulness; English data: other languages "
               "are uncalibrated; docs/offline-judge.md)"
               if nq and "mtrag_faithfulness_spearman" in held else ""))
    elif out.params.get("ragjudge.judge", "none") != "none":
        structured = out.params.get("ragjudge.judge.structured")
        judge = f"judge: {out.params['ragjudge.judge']} (structured output: {structured})"
        if out.config.get("context_mode"):
            judge += f"   context mode: {out.config['context_mode']}"
        lines.append(judge)
    judged = [name for name in out.results if f"{name}/error_rate" in m]
    if judged:
        # counts, not rates: the mean is over the scored rows; abstained and failed rows are not in it
        lines.append(f"  {'metric':<22} {'mean':>8} {'scored':>7} {'abstained':>10} {'failed':>7}   (of rows)")
        for name in judged:
            failing = {f["metric"] for f in out.failures}
            flag = "   <-- FAILING" if name in failing or (name in ("wscore", "lscore", "mscore")
                                                          and "multiturn" in failing) else ""
            rows = int(m.get(f"{name}/count", 0))
            counts = [int(m.get(f"{name}/{k}", 0)) for k in ("n_scored", "n_abstained", "n_failed")]
            lines.append(f"  {name:<22} {_fmt(m.get(f'{name}/mean')):>8} {counts[0]:>7} {counts[1]:>10} "
                         f"{counts[2]:>7}   ({rows}){flag}")
    lines += noise_lines(out)
    if out.skipped:
        lines.append("skipped (not in this run):")
        for name, reason in out.skipped.items():
            lines.append(f"  {name}: {reason}")
    for name, cal in (out.config.get("calibration") or {}).items():
        if "error" in cal:
            lines.append(f"  {name}: no calibrated estimate -- {cal['error']}")
        else:
            alone = f"[{cal['classical_ci_low']:.3f}, {cal['classical_ci_high']:.3f}]"
            lines.append(f"  {name}: calibrated by {int(cal['n_labelled'])} human labels: {cal['mean']:.3f} "
                         f"[{cal['ci_low']:.3f}, {cal['ci_high']:.3f}] (95%; labels alone {alone})"
                         + (f"  warning: {cal['warning']}" if cal.get("warning") else ""))
    ks = sorted({int(mt.group(1)) for k in m if (mt := _AT_K.search(k))})
    shown_k = ks[len(ks) // 2] if ks else None
    plain = []
    for k in sorted(m):
        at = _AT_K.search(k)
        if k.count("/") != 1 or not k.endswith("/mean") or k.split("/")[0] in judged or k.startswith("judge/"):
            continue
        if at and int(at.group(1)) != shown_k:
            continue
        plain.append(f"  {k:<34} {m[k]:.4f}")
    if plain:
        lines.append("no judge needed:")
        lines += plain
        if shown_k is not None and len(ks) > 1:
            lines.append(f"  (retrieval shown at k={shown_k}; k={ks} are all logged)")
    if "judge/calls" in m:
        cost = m.get("judge/cost_usd")
        usage = out.config.get("usage") or {}
        shared = int(m.get("judge/shared", 0))
        lines.append(
            f"judge usage: {int(usage.get('requests', 0))} requests sent, {int(m['judge/cache_hits'])} answered from "
            f"the cache" + (f", {shared} shared by identical calls of this run" if shared else "")
            + f", {int(m['judge/input_tokens'])} input / {int(m['judge/output_tokens'])} output tokens"
            + (f", ${cost:.4f}" if cost is not None else "")
        )
    for g in out.gate:  # one line each: the interval, the outcome, and for an undecided gate what would decide it
        lines.append(f"gate {_GATE_WORD[_outcome(g)]}: {g.get('message') or g['metric']}")
    if offline:
        lines.append("For LLM judgements: --judge openai:/gpt-4o-mini (OPENAI_API_KEY set), or any OpenAI-compatible "
                     "server: --judge 'openai:/<model>?base_url=http://host:port/v1'.")
    return "\n".join(lines + run_lines(run_id))


def run_lines(run_id: str) -> list[str]:
    """Where the run is and what its traces hold; when the tracking store stopped answering while it was logged,
    what was logged and how to write the rest (``ragjudge log-saved``), without asking the store again."""
    from ..adapters.run_log import logged
    from ..adapters.tracking import env_command, is_remote_uri, safe_tracking_uri, ui_hint

    uri = mlflow_uri()
    report = logged(run_id)
    if report is not None and report.unanswered:
        lines = [f"MLflow run {run_id} at {safe_tracking_uri(uri)}: its metrics, params, per-row table, transcripts "
                 "and config are logged, but the tracking store stopped answering while its traces were written, so "
                 "the run could not be ended (it shows as RUNNING)"]
    else:
        import mlflow

        run = mlflow.get_run(run_id)
        lines = [f"MLflow run {run_id} ({run.info.run_name}) in experiment {run.info.experiment_id} at "
                 f"{safe_tracking_uri(uri)}", f"  {ui_hint(run_id, experiment_id=run.info.experiment_id)}"]
        if (report is None or report.traces is None) and run.data.tags.get("ragjudge.traces"):
            lines.append(f"  traces: {run.data.tags['ragjudge.traces']} (the run's Traces tab: each row with its "
                         "judgments as assessments)")
    if report is not None and report.traces is not None and report.traces.logged + len(report.traces.unwritten):
        lines.append(f"  traces: {report.traces.describe()} (the run's Traces tab: each row with its judgments as "
                     "assessments)")
    if report is not None and report.kept is not None:
        store = f" --tracking-uri {safe_tracking_uri(uri)}" if is_remote_uri(uri) else ""
        lines.append(f"  the traces were not all written; when the store answers, write them (and end the run) with: "
                     f"{env_command('ragjudge')} log-saved {report.kept} --run-id {run_id}{store}")
    return lines


def mlflow_uri() -> str:
    import mlflow

    return str(mlflow.get_tracking_uri())


def store_stopped(run_id: str | None) -> bool:
    """Whether the tracking store stopped answering while run ``run_id`` was logged in this process."""
    from ..adapters.run_log import logged

    report = logged(run_id) if run_id else None
    return bool(report and report.unanswered)


def noise_lines(out: Any) -> list[str]:
    """What a run with repeats, a panel or a cascade says about its judges' noise (docs/judge-noise.md)."""
    drawn = out.config.get("draws")
    if not drawn:
        return []
    m, lines = out.metrics, []
    names = [k[: -len("/repeats")] for k in m if k.endswith("/repeats")]
    if names:
        lines.append(f"judge noise ({drawn['repeats']} draws per row; each row's score combines them "
                     f"({drawn['panel_rule']}), so the means' intervals include the judge's noise):")
        for name in names:
            if f"{name}/flip_rate" not in m:
                continue
            share = m.get(f"{name}/judge_share")
            lines.append(f"  {name:<22} flip rate {m[f'{name}/flip_rate']:.3f} [{m[f'{name}/flip_rate_ci_low']:.3f}, "
                         f"{m[f'{name}/flip_rate_ci_high']:.3f}]   judge variance {m[f'{name}/judge_variance']:.4f}"
                         + (f"   judge's share {share:.2f}" if share is not None else ""))
    if len(drawn["judges"]) > 1 and not drawn["cascade"]:
        lines.append(f"panel of {len(drawn['judges'])} judges ({', '.join(drawn['judges'])}), combined by "
                     f"{drawn['panel_rule']}:")
        for k in sorted(m):
            if k.endswith("/panel/fleiss_kappa"):
                name = k[: -len("/panel/fleiss_kappa")]
                alpha = m.get(f"{name}/panel/alpha")
                lines.append(f"  {name:<22} Fleiss kappa {m[k]:.3f}"
                             + (f"   Krippendorff alpha {alpha:.3f}" if alpha is not None else ""))
    if drawn["cascade"]:
        escalated = ", ".join(f"{metric} {n} of {out.config['rows']}" for metric, n in drawn["escalated"].items())
        lines.append(f"cascade: rows sent to {drawn['judges'][-1]}: {escalated or 'none'}; "
                     f"{int(m.get('judge/escalation/requests_saved', 0))} of its requests not sent")
    return lines


#: a gate's outcome as the summary writes it
_GATE_WORD = {"pass": "passed", "fail": "FAILED", "undecided": "UNDECIDED"}


def _outcome(g: dict[str, Any]) -> str:
    return str(g.get("outcome") or ("pass" if g["passed"] else "fail"))


def exit_code(out: Any) -> int:
    """3 when a judged metric failed on too many rows (each named on stderr), 4 when a gate failed, 6 when none
    failed but one is undecided (its interval straddles the threshold), else 0."""
    for f in out.failures:
        print(f"WARNING: {f['message']}", file=sys.stderr)
    if out.failures:
        print(f"error: {len(out.failures)} judged metric(s) failed on more than max_error_rate of their rows; "
              f"the run was logged, but its judged numbers are not usable (exit {EXIT_JUDGE_FAILURES})",
              file=sys.stderr)
        return EXIT_JUDGE_FAILURES
    failed = [g for g in out.gate if _outcome(g) == "fail"]
    undecided = [g for g in out.gate if _outcome(g) == "undecided"]
    for g in failed:
        print(f"error: gate failed: {g.get('message') or g['metric']}", file=sys.stderr)
    for g in undecided:
        print(f"error: gate undecided: {g['message']}", file=sys.stderr)
    if failed:  # a failed gate outranks an undecided one
        return EXIT_GATE_FAILED
    return EXIT_GATE_UNDECIDED if undecided else EXIT_OK
