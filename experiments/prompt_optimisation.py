"""Seed 004's prompt-optimisation loop (SPEC 2.8): design -> run -> evaluate -> analyse errors -> change the prompt.

Each iteration is one prompt style (``zero_shot``, ``few_shot``, ``cot``; see :mod:`experiments.rag_prompts`)
run over the scenario set of :mod:`experiments.scenarios`. Every input is checked against the input contract
before any call, every reply against the output contract (:mod:`experiments.contract`), and each iteration
is logged as one MLflow run with these checks:

==================================  ==========================================================================
metric                              definition
==================================  ==========================================================================
``format/adherence_rate``           replies that satisfy the output contract / replies
``refusal/correct_rate``            no-answer scenarios answered with exactly the fixed phrase of the language
``refusal/false_refusal_rate``      answerable scenarios answered with a not-found phrase
``refusal/accuracy``                scenarios where the refuse-or-answer decision was right
``context_utilisation/mean``        distinct given documents cited / documents given, over answerable scenarios
``sources/snippet_grounded_rate``   cited snippets found verbatim (whitespace-normalised) in the cited document
``hallucination/unsupported_rate``  mean share of an answer's distinct content terms found in no context
                                    (non-refusal answers only)
``hallucination/flag_rate``         scenarios whose answer has unsupported share > 0.25 (and is not a refusal)
``failure/<mode>_count``            broken_format, refusal_failure, false_refusal, hallucination, off_topic,
                                    wrong_language
==================================  ==========================================================================

The hallucination measure is a **lexical proxy**: a term the contexts do not contain is not necessarily false
(a paraphrase, "the documents disagree") and a false statement can be made of context words. It finds invented
names and numbers, which is what it is for. Broken replies are read leniently for the other checks (the JSON
object inside the prose, else the text), so one failure is not counted under several names.

On the answerable scenarios the ``ragjudge`` evaluator adds lexical metrics (word recall, ROUGE-L) and, with a
judge, correctness (context mode ``gold``: the scenario's evidence documents) and, with an LLM judge,
faithfulness.

Offline (the default) the generator is SIMULATED (:mod:`experiments.simulated_generator`): scripted replies,
not a model, so the numbers show that the loop works, not how any prompt performs. With ``--generator <URI>``
the same loop runs a real model.

    python -m experiments.prompt_optimisation
    python -m experiments.prompt_optimisation --generator openai:/gpt-4o-mini --judge openai:/gpt-4o-mini
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from experiments.contract import (  # noqa: E402
    ContractError,
    check_output,
    is_refusal,
    lenient_answer,
    lenient_object,
    validate_input,
)
from experiments.rag_prompts import STYLES, prompt_version, render  # noqa: E402
from experiments.scenarios import CORPUS, SCENARIOS, Scenario  # noqa: E402
from experiments.simulated_generator import simulated_backend  # noqa: E402
from experiments.text_utils import CJK_CHARS, content_terms  # noqa: E402
from experiments.toy_rag import LLMGenerator  # noqa: E402
from mlflow_ragjudge.backends import Backend  # noqa: E402

__all__ = [
    "FAILURE_MODES",
    "HALLUCINATION_THRESHOLD",
    "ITERATION_NOTES",
    "ScenarioResult",
    "assess",
    "error_analysis",
    "main",
    "optimisation_loop",
    "run_iteration",
    "summarise",
]

DEFAULT_EXPERIMENT = "ragjudge-prompt-optimisation"
DEFAULT_JUDGE = "offline:/lexical"
HALLUCINATION_THRESHOLD = 0.25
FAILURE_MODES = ("broken_format", "refusal_failure", "false_refusal", "hallucination", "off_topic", "wrong_language")
ITERATION_NOTES = {
    "zero_shot": "baseline: rules only (answer from the context, fixed not-found phrase, JSON contract)",
    "few_shot": "adds worked examples: an answer with cited snippets from two documents and a not-found case",
    "cot": "adds constrained reasoning: relevant passages, integration, hallucination and gap check, then answer",
}
HEADLINE = ["format/adherence_rate", "refusal/accuracy", "hallucination/flag_rate", "context_utilisation/mean"]
_CJK = re.compile(f"[{CJK_CHARS}]")
_TABLE = [
    "format/adherence_rate",
    "refusal/correct_rate",
    "refusal/false_refusal_rate",
    "refusal/accuracy",
    "context_utilisation/mean",
    "sources/snippet_grounded_rate",
    "hallucination/flag_rate",
    "hallucination/unsupported_rate",
    "word_recall/mean",
    "correctness/mean",
    "correctness/abstain_rate",
    "faithfulness/mean",
]


@dataclass
class ScenarioResult:
    """One scenario's reply and every check on it."""

    scenario_id: str
    kind: str
    language: str
    should_refuse: bool
    raw: str
    answer: str
    format_ok: bool
    violations: list[str]
    refused: bool  # a not-found phrase of either language
    refused_correctly: bool  # exactly the phrase of the scenario's language, where refusal is right
    cited: list[str]
    utilisation: float
    snippets_grounded: int
    snippets_cited: int
    unsupported_terms: list[str]
    unsupported_rate: float | None  # None for refusals and empty answers
    confidence: float | None
    failure_modes: list[str] = field(default_factory=list)


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def assess(s: Scenario, raw: str, *, cot: bool, generation_error: str = "") -> ScenarioResult:
    """Check one reply: contract, refusal, context utilisation, snippet grounding, hallucination proxy."""
    contexts = {c.doc_id: c.text for c in s.contexts}
    check = check_output(raw, list(contexts), cot=cot)
    violations = check.messages()
    if generation_error:
        violations.insert(0, str(ContractError("reply", f"generation failed ({generation_error})",
                                               "check the generator URI, its server and credentials")))
    obj = lenient_object(check) or {}
    answer = lenient_answer(check) if not generation_error else ""
    refused = is_refusal(answer)
    refused_correctly = s.should_refuse and is_refusal(answer, s.language)
    raw_sources = obj.get("sources")
    sources: list[Any] = raw_sources if isinstance(raw_sources, list) else []
    cited: list[str] = []
    grounded = n_snippets = 0
    for src in sources:
        if not isinstance(src, dict):
            continue
        doc_id = src.get("doc_id")
        if doc_id in contexts and doc_id not in cited:
            cited.append(doc_id)
        snippet = src.get("snippet")
        if isinstance(snippet, str) and snippet.strip():
            n_snippets += 1
            grounded += doc_id in contexts and _norm(snippet) in _norm(contexts[doc_id])
    context_terms = {t for text in contexts.values() for t in content_terms(text)}
    answer_terms = list(dict.fromkeys(content_terms(answer)))
    unsupported = [t for t in answer_terms if t not in context_terms]
    rate = None if refused or not answer_terms else len(unsupported) / len(answer_terms)
    conf = obj.get("confidence_score")
    modes = []
    if not check.ok or generation_error:
        modes.append("broken_format")
    if s.should_refuse and not refused_correctly:
        modes.append("refusal_failure")
    if not s.should_refuse and refused:
        modes.append("false_refusal")
    if rate is not None and rate > HALLUCINATION_THRESHOLD:
        modes.append("hallucination")
    if answer and not refused and not set(answer_terms) & set(content_terms(s.query)):
        modes.append("off_topic")
    if answer and (s.language == "ja") != bool(_CJK.search(answer)):
        modes.append("wrong_language")
    return ScenarioResult(
        scenario_id=s.scenario_id,
        kind=s.kind,
        language=s.language,
        should_refuse=s.should_refuse,
        raw=raw,
        answer=answer,
        format_ok=check.ok and not generation_error,
        violations=violations,
        refused=refused,
        refused_correctly=refused_correctly,
        cited=cited,
        utilisation=len(cited) / len(contexts) if contexts else 0.0,
        snippets_grounded=grounded,
        snippets_cited=n_snippets,
        unsupported_terms=unsupported,
        unsupported_rate=rate,
        confidence=float(conf) if isinstance(conf, (int, float)) and not isinstance(conf, bool) else None,
        failure_modes=modes,
    )


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def summarise(results: Sequence[ScenarioResult]) -> dict[str, float]:
    """Aggregate the per-scenario checks into the run's metrics (see the module docstring)."""
    refuse = [r for r in results if r.should_refuse]
    answerable = [r for r in results if not r.should_refuse]
    rates = [r.unsupported_rate for r in results if r.unsupported_rate is not None]
    snippets = sum(r.snippets_cited for r in results)
    out = {
        "scenarios/count": float(len(results)),
        "format/adherence_rate": _mean([float(r.format_ok) for r in results]),
        "refusal/correct_rate": _mean([float(r.refused_correctly) for r in refuse]),
        "refusal/false_refusal_rate": _mean([float(r.refused) for r in answerable]),
        "refusal/accuracy": _mean([float(r.refused_correctly if r.should_refuse else not r.refused) for r in results]),
        "context_utilisation/mean": _mean([r.utilisation for r in answerable]),
        "sources/snippet_grounded_rate": sum(r.snippets_grounded for r in results) / snippets if snippets else 0.0,
        "hallucination/unsupported_rate": _mean(rates),
        "hallucination/flag_rate": _mean([float("hallucination" in r.failure_modes) for r in results]),
        "confidence/mean": _mean([r.confidence for r in results if r.confidence is not None]),
    }
    for mode in FAILURE_MODES:
        out[f"failure/{mode}_count"] = float(sum(mode in r.failure_modes for r in results))
    return out


def error_analysis(style: str, results: Sequence[ScenarioResult]) -> str:
    """The error-analysis step: every failed scenario with its failure modes and evidence, as Markdown."""
    lines = [f"# Error analysis: {style}", ""]
    failed = [r for r in results if r.failure_modes]
    if not failed:
        return "\n".join([*lines, "No failures."])
    counts = {m: sum(m in r.failure_modes for r in results) for m in FAILURE_MODES}
    lines.append("Failure modes: " + ", ".join(f"{m} x{n}" for m, n in counts.items() if n))
    lines.append("")
    for r in failed:
        lines.append(f"- **{r.scenario_id}** ({r.kind}, {r.language}): {', '.join(r.failure_modes)}")
        lines.append(f"  - answer: {r.answer[:160]!r}")
        for v in r.violations[:3]:
            lines.append(f"  - contract: {v}")
        if "hallucination" in r.failure_modes:
            lines.append(f"  - terms in no context: {', '.join(r.unsupported_terms[:10])}")
    return "\n".join(lines)


def _generator(style: str, generator: str | Backend | None, structured: bool, cache: bool) -> LLMGenerator:
    if generator is None:  # offline: scripted, uncached so an edited script is never served stale
        return LLMGenerator(simulated_backend(style), style, cache=False)
    return LLMGenerator(generator, style, structured=structured and style != "cot", cache=cache)


def _judge_metrics(judge: str | None) -> list[str]:
    if judge is None:
        return ["lexical"]
    return ["lexical", "correctness", "faithfulness"]


def run_iteration(
    iteration: int,
    style: str,
    scenarios: Sequence[Scenario] = SCENARIOS,
    *,
    generator: str | Backend | None = None,
    judge: str | None = DEFAULT_JUDGE,
    structured: bool = False,
    cache: bool = True,
) -> tuple[str, dict[str, float], list[ScenarioResult]]:
    """Run one prompt style over the scenarios as one MLflow run (in the current experiment).

    Returns ``(run_id, metrics, per-scenario results)``.

    Raises:
        RuntimeError: the generator failed on the first scenario (nothing is logged).
    """
    import mlflow

    gen = _generator(style, generator, structured, cache)
    results: list[ScenarioResult] = []
    for s in scenarios:
        out = gen.generate(s.query, s.contexts, s.language)
        if out.error and not results:  # a wrong URI or a server that is down: stop before logging a run
            raise RuntimeError(f"The generator failed on the first scenario ({s.scenario_id}): {out.error}")
        results.append(assess(s, out.raw, cot=style == "cot", generation_error=out.error))
    metrics = summarise(results)
    simulated = generator is None
    with mlflow.start_run(run_name=f"{iteration}-{style}") as run:
        mlflow.log_params(
            {
                "prompt.style": style,
                "prompt.version": prompt_version(style),
                "iteration": iteration,
                "iteration.change": ITERATION_NOTES[style],
                "generator": gen.name if not simulated else f"simulated:{style}",
                "simulation": str(simulated).lower(),
                "scenarios": len(scenarios),
                "structured": str(structured and style != "cot").lower(),
                "hallucination.threshold": HALLUCINATION_THRESHOLD,
            }
        )
        mlflow.set_tags(
            {
                "ragjudge.experiment": "prompt-optimisation",
                "simulation": str(simulated).lower(),
                "mlflow.note.content": (
                    "SIMULATED generator: scripted replies (experiments/simulated_generator.py), not a model; "
                    "the metrics describe the script." if simulated else f"generator {gen.name}"
                ),
            }
        )
        mlflow.log_metrics({k: v for k, v in metrics.items() if v == v})  # NaN (empty subset) is not logged
        example = validate_input(scenarios[0].query, scenarios[0].contexts, scenarios[0].language)
        mlflow.log_dict({"style": style, "version": prompt_version(style), "messages": render(style, example)},
                        "prompt/example_messages.json")
        table = pd.DataFrame([asdict(r) for r in results])
        for col in ("violations", "cited", "unsupported_terms", "failure_modes"):
            table[col] = table[col].map(lambda v: json.dumps(v, ensure_ascii=False))
        mlflow.log_table(table, artifact_file="prompt_eval/scenarios.json")
        mlflow.log_text(error_analysis(style, results), "prompt_eval/error_analysis.md")
        answerable = [(s, r) for s, r in zip(scenarios, results) if not s.should_refuse]
        if answerable:
            df = pd.DataFrame(
                {
                    "question": [s.query for s, _ in answerable],
                    "answer": [r.answer for _, r in answerable],
                    "reference": [s.reference for s, _ in answerable],
                    "contexts": [[c.text for c in s.contexts] for s, _ in answerable],
                    "gold_documents": [[CORPUS[d] for d in dict.fromkeys(d for d, _ in s.evidence)]
                                       for s, _ in answerable],
                    "group": [s.language for s, _ in answerable],
                }
            )
            config: dict[str, Any] = {"metrics": _judge_metrics(judge), "bertscore": False, "cache": cache,
                                      "progress": False}
            if judge:
                config.update(judge=judge, context_mode="gold")
            result = mlflow.models.evaluate(data=df, predictions="answer", targets="reference", model_type="rag",
                                            evaluators="ragjudge", evaluator_config=config)
            metrics.update({k: v for k, v in result.metrics.items() if k.count("/") == 1})
    return run.info.run_id, metrics, results


def optimisation_loop(
    styles: Sequence[str] = STYLES,
    scenarios: Sequence[Scenario] = SCENARIOS,
    *,
    generator: str | Backend | None = None,
    judge: str | None = DEFAULT_JUDGE,
    experiment: str = DEFAULT_EXPERIMENT,
    tracking_uri: str | None = None,
    structured: bool = False,
    cache: bool = True,
    verbose: bool = False,
) -> pd.DataFrame:
    """Validate every input, then run one iteration per style, printing each error analysis when ``verbose``.

    Returns one row per iteration: style, run id and the headline metrics.

    Raises:
        ContractError: a scenario violates the input contract (before any generation).
    """
    import mlflow

    for s in scenarios:
        validate_input(s.query, s.contexts, s.language)
    bad = [s for s in styles if s not in STYLES]
    if bad:
        raise ValueError(f"Unknown prompt style(s) {bad}; use {', '.join(STYLES)}.")
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment)
    rows = []
    for i, style in enumerate(styles, 1):
        run_id, metrics, results = run_iteration(i, style, scenarios, generator=generator, judge=judge,
                                                 structured=structured, cache=cache)
        rows.append({"iteration": i, "style": style, **{k: metrics.get(k) for k in _TABLE}, "run_id": run_id})
        if verbose:
            print(f"\n=== iteration {i}: {style} - {ITERATION_NOTES[style]}")
            print("  " + "  ".join(f"{k}={metrics[k]:.3f}" for k in HEADLINE))
            print(error_analysis(style, results))
    return pd.DataFrame(rows)



def format_table(table: pd.DataFrame) -> str:
    shown = table.dropna(axis=1, how="all").copy()
    shown["run_id"] = shown["run_id"].str[:8]
    return shown.to_string(index=False, float_format=lambda x: f"{x:.3f}", na_rep="-")


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments.prompt_optimisation",
        description="Seed 004's prompt-optimisation loop: one MLflow run per prompt style over the scenario set.",
    )
    p.add_argument("--generator",
                   help="generator model URI (e.g. openai:/gpt-4o-mini); default: the SIMULATED offline generator")
    p.add_argument("--judge", default=DEFAULT_JUDGE,
                   help="judge URI for ragjudge correctness and faithfulness, or 'none' "
                        "(default: offline:/lexical, the offline judge, not an LLM)")
    p.add_argument("--styles", default=",".join(STYLES), help=f"iterations, in order (default {','.join(STYLES)})")
    p.add_argument("--structured", action="store_true",
                   help="ask the generator for the contract's JSON schema (zero_shot/few_shot only)")
    p.add_argument("--experiment", default=DEFAULT_EXPERIMENT)
    p.add_argument("--tracking-uri",
                   help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///experiments.db)")
    p.add_argument("--no-cache", action="store_true", help="do not use the call cache")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    args = _build_parser().parse_args(argv)
    styles = [s.strip() for s in args.styles.split(",") if s.strip()]
    judge = None if args.judge.lower() == "none" else args.judge
    tracking = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///experiments.db"
    if args.generator is None:
        print("generator: SIMULATED (scripted replies, not a model) - the numbers below describe the script")
    try:
        table = optimisation_loop(styles, generator=args.generator, judge=judge, experiment=args.experiment,
                                  tracking_uri=tracking, structured=args.structured, cache=not args.no_cache,
                                  verbose=True)
    except (ValueError, RuntimeError) as e:  # ContractError, InputError, bad settings, an unreachable generator
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"\n{len(table)} iterations logged to experiment {args.experiment!r} at {tracking}")
    print(format_table(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
