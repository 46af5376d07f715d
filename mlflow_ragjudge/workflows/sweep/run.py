"""The sweep itself, in its three steps: check everything and probe once, then one child run per variant, then the
comparison on the parent (the package docstring says what each step does)."""

from __future__ import annotations

import inspect
import json
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ...adapters import tracking
from ...adapters.run_log import log_output, save_local
from ...adapters.traces import log_failed_calls
from ...core.errors import InputError, Interrupted, UnstableParameterWarning
from ...core.stop import stop_on_signals, stop_reason, stop_requested
from ...engine.config import RagJudgeConfig
from ...engine.evaluate import EvalOutput, evaluate_frame
from ..compare import (
    COLUMNS,
    HEADLINE_PREFIX,
    comparison_figures,
    headline_metrics,
    log_comparison,
    paired_comparison,
    scores_by_row,
)
from .generation import OUTPUT_KEYS, Generations, PipelineFailed, generate, pipeline_identity, retriever_for
from .result import SweepResult
from .variants import (
    PromptTemplate,
    expand_variants,
    params_key,
    resolve_prompts,
    shown_value,
    unstable_params,
    variant_names,
)

GENERATIONS_FILE = "ragjudge/generations.json"


def _check_data(data: Any, cfg: RagJudgeConfig) -> pd.DataFrame:
    if not isinstance(data, pd.DataFrame):
        raise InputError(f"data must be a pandas DataFrame of questions, got {type(data).__name__}.")
    if len(data) == 0:
        raise InputError("data has no rows: give at least one question.")
    qcol = cfg.column("question")
    if qcol not in data.columns:
        raise InputError(f"data has no '{qcol}' column (columns: {list(data.columns)}); a sweep asks the pipeline "
                         "each question.")
    for i, q in enumerate(data[qcol]):
        if not isinstance(q, str) or not q.strip():
            raise InputError(f"Column '{qcol}' row {i} is {q!r}; every question must be non-empty text.")
    taken = [cfg.column(k) for k in OUTPUT_KEYS if cfg.column(k) in data.columns]
    if taken:
        raise InputError(f"data already has {taken}; in a sweep these come from the pipeline. Drop them (or rename "
                         "them) before sweeping.")
    return data.reset_index(drop=True)


def dataset_name(data: pd.DataFrame, given: str | None) -> str:
    """The dataset's name in MLflow: ``given``, else the DataFrame's own name (``df.attrs["name"]``, or a ``name``
    attribute set on it), else ``data-<hash of its first column>``."""
    import hashlib

    if given:
        return given
    own = data.attrs.get("name") if isinstance(data.attrs, dict) else None
    own = own or data.__dict__.get("name")
    if isinstance(own, str) and own.strip():
        return own.strip()
    digest = hashlib.sha256("\x1f".join(map(str, data.iloc[:, 0].tolist())).encode("utf-8", "surrogatepass"))
    return f"data-{digest.hexdigest()[:8]}"


def _log(message: str, verbose: bool) -> None:
    """A progress line; one that cannot be written (stderr closed, a pipe whose reader left) never stops the sweep."""
    if verbose and sys.stderr is not None:
        try:
            print(message, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass


@dataclass(frozen=True)
class SweepSettings:
    """What :func:`sweep` was asked, besides the pipeline, the variants and the data: its keyword arguments as given
    (their meaning and defaults are in its docstring), handed whole to each step instead of one by one."""

    evaluator_config: Mapping[str, Any] | None
    experiment: str | None
    baseline: int | str
    run_name: str | None
    retriever: Callable[..., Any] | None
    data_name: str | None
    pipeline_version: str | None
    compare: Sequence[str] | None
    headline: Sequence[str] | None
    alpha: float
    n_boot: int
    seed: int
    workers: int
    tracking_uri: str | None
    plots: bool
    verbose: bool


@dataclass
class _Plan:
    """Everything a sweep knows once its inputs are checked and before it opens a run."""

    settings: SweepSettings
    config: dict[str, Any]
    cfg: RagJudgeConfig
    data: pd.DataFrame
    names: list[str]
    kwargs_list: list[dict[str, Any]]
    prompt_versions: list[dict[str, Any]]
    recorded: dict[str, dict[str, Any]]
    base: str
    gens: Generations
    #: per variant, the generation cache's key of its parameters (None: no stable identity, not cached)
    pkeys: list[str | None] = field(default_factory=list)
    #: variant index -> question index -> the probe's answer ``(output, from_cache)`` or the pipeline's error
    done: dict[int, dict[int, tuple[dict[str, Any], bool] | str]] = field(default_factory=dict)
    questions: list[str] = field(default_factory=list)
    #: the metrics each child run shows first (``sweep(headline=...)``, else ``compare``; None: from the first
    #: variant evaluated, :func:`~mlflow_ragjudge.workflows.compare.headline_metrics`)
    headline: list[str] | None = None


#: the probe gives up looking for a question the pipeline answers after this many failures (the sweep goes on)
PROBE_FAILURES = 5


def _check_param_names(pipeline: Callable[..., Any], param_list: list[dict[str, Any]]) -> None:
    """A parameter that would collide with the question argument, or that the pipeline does not take, is refused
    before the pipeline is called."""
    try:
        sig = inspect.signature(pipeline)
    except (TypeError, ValueError):
        sig = None
    positional = [p for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)] if sig else []
    own = {"question"} | ({positional[0].name} if positional and positional[0].kind is not
                                                  inspect.Parameter.POSITIONAL_ONLY else set())
    names = list(dict.fromkeys(k for p in param_list for k in p))
    for k in names:
        if k in own:
            raise InputError(
                f"Variant parameter {k!r} collides with the pipeline's own argument: a sweep calls "
                f"pipeline(question, **params), so {k!r} would be given twice. Rename the parameter (e.g. "
                f"'{k}_style') in the grid and in the pipeline's signature.")
    if sig is not None and not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        taken = {p.name for p in sig.parameters.values() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
        unknown = [k for k in names if k not in taken]
        if unknown:
            raise InputError(f"Variant parameter(s) {unknown} are not arguments of the pipeline (it takes "
                             f"{sorted(taken - own)}); add them to its signature or remove them from the grid.")


def _probe(plan: _Plan) -> None:
    """The first answer the pipeline gives (the first question of the first variant, unless the pipeline raises
    there: then the next question, up to :data:`PROBE_FAILURES` failures, each recorded for its row) and the
    dry-run evaluation of that row. A return value of the wrong kind is an InputError here."""
    failures = 0
    for i, kwargs in enumerate(plan.kwargs_list):
        for j, question in enumerate(plan.questions):
            try:
                got = plan.gens.get(question, kwargs, plan.pkeys[i], f"row {j} of variant {plan.names[i]!r}")
            except PipelineFailed as e:
                plan.done.setdefault(i, {})[j] = str(e)
                failures += 1
                if failures >= PROBE_FAILURES:
                    return
                continue
            plan.done.setdefault(i, {})[j] = got
            probe = plan.data.iloc[j:j + 1].reset_index(drop=True).copy()
            for k, v in got[0].items():
                probe[plan.cfg.column(k)] = [v]
            retriever = retriever_for(plan.settings.retriever, kwargs) or plan.config.get("retriever")
            evaluate_frame(probe, {**plan.config, "dry_run": True, "progress": False, "retriever": retriever})
            return


def _baseline_index(baseline: int | str, names: list[str], param_list: list[dict[str, Any]]) -> int | None:
    """The baseline's index, or None when it names a prompt variant known only once its prompts are registered. A
    name is a run name (:func:`variant_names`)."""
    if isinstance(baseline, int) and not isinstance(baseline, bool):
        if not 0 <= baseline < len(names):
            raise ValueError(f"baseline={baseline} is not a variant index (0..{len(names) - 1})")
        return baseline
    if baseline in names:
        return names.index(str(baseline))
    if not any(isinstance(v, PromptTemplate) or (isinstance(v, str) and v.startswith("prompts:/"))
               for p in param_list for v in p.values()):
        raise ValueError(f"baseline {baseline!r} is not one of the variants {names}")
    return None


def _plan(pipeline: Callable[..., Any], variants: Any, data: Any, settings: SweepSettings) -> _Plan:
    """Step 1: check the variants, the data, the config and the tracking store, register the prompts, then answer
    the first question of the first variant and dry-run its evaluation -- before anything else is paid for."""
    retriever, workers, baseline = settings.retriever, settings.workers, settings.baseline
    if not callable(pipeline):
        raise InputError(f"pipeline must be callable: pipeline(question, **params) -> answer; got "
                         f"{type(pipeline).__name__}.")
    if retriever is not None and not callable(retriever):
        raise InputError("retriever must be callable: retriever(query, **params) -> passages.")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} must be a whole number >= 1")
    config = dict(settings.evaluator_config or {})
    if "retriever" in config and retriever is not None:
        raise ValueError("give the E3 retriever once: sweep(retriever=...) (called with each variant's parameters) "
                         "or evaluator_config['retriever'], not both")
    cfg = RagJudgeConfig.from_dict(config)
    data = _check_data(data, cfg)
    param_list = expand_variants(variants)
    _check_param_names(pipeline, param_list)
    names = variant_names(param_list)
    keys = [params_key(p) for p in param_list]
    dupes = sorted({n for n, k in zip(names, keys) if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"variants {dupes} appear more than once; each variant must differ in its parameters")
    base_index = _baseline_index(baseline, names, param_list)
    # the tracking store must answer before the pipeline or the judge is paid for
    tracking.check_tracking_store(settings.tracking_uri, settings.experiment,
                                  nothing="Nothing was generated or judged.")
    kwargs_list, prompt_versions, resolved_keys = resolve_prompts(param_list)
    pkeys: list[str | None] = list(resolved_keys)  # None: a variant whose answers are not cached (below)
    # the parameters as recorded: a prompt as <name>@v<version>; the run names show them that way
    recorded_list = [{k: (f"{pvs[k].name}@v{pvs[k].version}" if k in pvs else v) for k, v in p.items()}
                     for p, pvs in zip(param_list, prompt_versions)]
    names = variant_names(recorded_list)
    recorded_keys = [params_key(p) for p in recorded_list]
    if len(set(recorded_keys)) < len(recorded_keys):  # two templates that are one registered version
        raise ValueError(f"two variants are the same after resolving their prompts: {names}")
    if base_index is None:
        base_index = _baseline_index(baseline, names, recorded_list)
        if base_index is None:
            raise ValueError(f"baseline {baseline!r} is not one of the variants {names}")
    for i, p in enumerate(param_list):
        unstable = unstable_params(p)
        if unstable:
            pkeys[i] = None
            warnings.warn(
                f"Variant {names[i]!r}: parameter(s) {unstable} hold objects with no identity that lasts beyond this "
                "process (their repr shows a memory address), so this variant's answers are not cached and are "
                "generated again on every run. Give the object a 'cache_key' attribute (text naming its "
                "configuration), or pass ('label', object) as the value (docs/sweeps.md).",
                UnstableParameterWarning, stacklevel=3)
    plan = _Plan(settings=settings, config=config, cfg=cfg, data=data, names=names, kwargs_list=kwargs_list,
                 prompt_versions=prompt_versions, recorded=dict(zip(names, recorded_list)), base=names[base_index],
                 gens=Generations(pipeline, pipeline_identity(pipeline, settings.pipeline_version), cfg.cache),
                 pkeys=pkeys, questions=data[cfg.column("question")].tolist())
    _probe(plan)
    return plan


def _generations_table(questions: list[str], outs: list[dict[str, Any] | None], errors: list[str | None],
                       cached: list[bool]) -> pd.DataFrame:
    def cell(o: dict[str, Any] | None, key: str) -> Any:
        return json.dumps(o.get(key), ensure_ascii=False) if o and key in o else None

    return pd.DataFrame({
        "question": questions, "answer": [o.get("answer") if o else None for o in outs],
        "contexts": [cell(o, "contexts") for o in outs],
        "retrieved_doc_ids": [cell(o, "retrieved_doc_ids") for o in outs],
        "citations": [cell(o, "citations") for o in outs], "generation_error": errors, "from_cache": cached,
    })


def _pipeline_calls(plan: _Plan, kwargs: dict[str, Any], ok: list[int], cached: list[bool],
                    timings: dict[int, float]) -> list[dict[str, Any]]:
    """Per evaluated row, the call to the user's pipeline as the row's trace shows it (a span)."""
    target = plan.gens.pipeline
    name = getattr(target, "__name__", None) or type(target).__name__
    shown = {k: shown_value(v)[:2000] for k, v in kwargs.items()}
    return [{"name": f"pipeline: {name}", "inputs": {"question": plan.questions[j], **shown},
             "seconds": timings.get(j, 0.0), "from_cache": cached[j]} for j in ok]


def _log_headline(plan: _Plan, child: tracking.RunLog, out: EvalOutput | None) -> None:
    """The headline metrics' means as ``_headline/<metric>``, each in its own request and before any other metric of
    the run, so that the store lists them first (the MLflow UI's compare-runs page opens its parallel-coordinates
    plot on a run's first metric; its chart view puts the ``_headline`` section first)."""
    if out is None:
        return
    means = [k[: -len("/mean")] for k in out.metrics if k.endswith("/mean")]
    if plan.headline is None:
        plan.headline = headline_metrics(means)
    for metric in plan.headline:
        value = out.metrics.get(f"{metric}/mean")
        if value is not None:
            child.metrics({HEADLINE_PREFIX + metric: float(value)})


def _variant(plan: _Plan, i: int, name: str, parent: tracking.RunLog, dname: str, result: SweepResult,
             scores: dict[str, dict[str, dict[Any, float]]]) -> None:
    """Step 2, one variant: answer every question, evaluate the answers, log the child run."""
    kwargs, pvs = plan.kwargs_list[i], plan.prompt_versions[i]
    verbose = plan.settings.verbose
    _log(f"[{i + 1}/{len(plan.names)}] {name}", verbose)
    t0 = time.perf_counter()
    # what the probe already answered (or saw fail)
    timings: dict[int, float] = {}
    outs, errors, cached = generate(plan.gens, plan.questions, kwargs, plan.pkeys[i], name, plan.settings.workers,
                                    plan.done.get(i, {}), timings)
    seconds = time.perf_counter() - t0
    ok = [j for j in range(len(plan.questions)) if outs[j] is not None]
    gen_stats = {"rows": len(plan.questions), "generated": sum(1 for j in ok if not cached[j]),
                 "cached": sum(1 for j in ok if cached[j]), "failed": len(plan.questions) - len(ok),
                 "seconds": round(seconds, 3)}
    result.generation[name] = gen_stats
    failed = [e for e in errors if e is not None]
    if failed and len(failed) / len(plan.questions) > plan.cfg.max_error_rate:
        result.generation_failures[name] = (
            f"the pipeline failed on {len(failed)} of {len(plan.questions)} questions (more than max_error_rate="
            f"{plan.cfg.max_error_rate:g}); first error: {failed[0][:300]} -- every error is in this variant's "
            f"{GENERATIONS_FILE}")
        _log(f"    GENERATION FAILED: {result.generation_failures[name]}", verbose)
    _log(f"    answers: {gen_stats['generated']} generated, {gen_stats['cached']} from the cache, "
         f"{gen_stats['failed']} failed", verbose)
    out: EvalOutput | None = None
    if ok:
        frame = plan.data.iloc[ok].reset_index(drop=True).copy()
        for key in OUTPUT_KEYS:
            if any(key in (outs[j] or {}) for j in ok):
                frame[plan.cfg.column(key)] = [(outs[j] or {}).get(key) for j in ok]
        try:
            retriever = retriever_for(plan.settings.retriever, kwargs) or plan.config.get("retriever")
            out = evaluate_frame(frame, {**plan.config, "retriever": retriever})
            scores[name] = scores_by_row(out.results, rows=ok)
        except InputError as e:  # this variant's answers cannot be evaluated (the first variant's could)
            result.errors[name] = str(e)
            _log(f"    not evaluated: {e}", verbose)
        except Interrupted as e:  # stopped while answering: its answers are logged, nothing was judged
            result.errors[name] = str(e)
    result.outputs[name] = out
    with tracking.open_run(name, nested=True) as child:
        result.run_ids[name] = child.run_id
        child.params({f"variant.{k}": shown_value(v)[:6000] for k, v in plan.recorded[name].items()})
        child.tags({"ragjudge.sweep": "variant", "ragjudge.sweep.parent": parent.run_id,
                    "ragjudge.sweep.baseline": str(name == plan.base).lower()})
        _log_headline(plan, child, out)
        child.dataset(plan.data, dname)
        child.metrics({"generation/failed_rate": gen_stats["failed"] / len(plan.questions),
                       "generation/seconds": seconds, "generation/cached": gen_stats["cached"],
                       "generation/generated": gen_stats["generated"]})
        for pv in pvs.values():
            child.link_prompt(pv)
        if pvs:
            child.params({f"prompt.{k}": f"prompts:/{pv.name}/{pv.version}" for k, pv in pvs.items()})
        tracking.replace_table(child.run_id, _generations_table(plan.questions, outs, errors, cached),
                               GENERATIONS_FILE)
        failed_js = [j for j in range(len(plan.questions)) if errors[j]]
        failed_calls = _pipeline_calls(plan, kwargs, failed_js, cached, timings)
        log_failed_calls(child.run_id, [(j, plan.questions[j], {**c, "error": errors[j]})
                                        for j, c in zip(failed_js, failed_calls)], max_traces=plan.cfg.traces)
        if out is not None:
            calls = _pipeline_calls(plan, kwargs, ok, cached, timings)
            log_output(out, child.run_id, saved=save_local(out, f"sweep-{i}"), pipeline=calls)
        else:
            child.tags({"ragjudge.status": "evaluation_error" if name in result.errors else "no_answers"})
            if not ok:
                child.tags({"ragjudge.generation_error": (failed[0] if failed else "no questions")[:5000]})
            if name in result.errors:
                child.tags({"ragjudge.evaluation_error": result.errors[name][:5000]})
    if stop_requested():  # what this variant logged is what it had when Ctrl-C / SIGTERM came
        tracking.mark_killed(child.run_id)
    _log(f"    run {child.run_id}", verbose)


def sweep(
    pipeline: Callable[..., Any],
    variants: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]],
    data: pd.DataFrame,
    *,
    evaluator_config: Mapping[str, Any] | None = None,
    experiment: str | None = None,
    baseline: int | str = 0,
    run_name: str | None = None,
    retriever: Callable[..., Any] | None = None,
    data_name: str | None = None,
    pipeline_version: str | None = None,
    compare: Sequence[str] | None = None,
    headline: Sequence[str] | None = None,
    alpha: float = 0.05,
    n_boot: int = 2000,
    seed: int = 0,
    workers: int = 1,
    tracking_uri: str | None = None,
    plots: bool = True,
    verbose: bool = False,
) -> SweepResult:
    """Run every variant of ``pipeline`` over ``data``, each as a child run, and compare them (package docstring).

    Args:
        pipeline: your RAG system, ``pipeline(question, **params)`` -> the answer (str), or a dict with
            ``answer`` and optionally ``contexts``, ``retrieved_doc_ids``, ``citations`` and ``raw_output`` (the
            raw reply the answer was extracted from, for the output-contract check).
        variants: a list of parameter dicts, or a grid ``{param: [values]}``. A value may be a
            :class:`PromptTemplate` or a ``prompts:/name/version`` URI (the pipeline receives the template text).
        data: the questions and whatever the metrics need besides the pipeline's outputs (``reference``,
            ``relevant_doc_ids``, ``answerable``, human scores ...).
        evaluator_config: the ``ragjudge`` settings (judge, metrics, ...), as for ``mlflow.evaluate``.
        experiment: the MLflow experiment (created if missing; default: the active one).
        baseline: the variant the others are compared with: its index or its name.
        run_name: the parent run's name (default ``sweep-<data name>-<time>``).
        retriever: the E3 retriever, ``retriever(query, **params)``, called with each variant's parameters (the
            ones it accepts) and question + reference answer.
        data_name: the dataset's name in MLflow (default: ``data.attrs["name"]`` where set, else
            ``data-<hash of its first column>``; the CLI uses the data file's name).
        pipeline_version: a label to add to the generation cache key (when the pipeline's behaviour changes
            without its source changing).
        compare: the metrics to compare (default: :func:`mlflow_ragjudge.workflows.compare.default_metrics`).
        headline: the metrics shown first -- in the MLflow UI (each child run logs their means as
            ``_headline/<metric>`` before any other metric) and in the plots; default ``compare`` when given, else
            correctness and faithfulness where evaluated (:func:`~mlflow_ragjudge.workflows.compare.headline_metrics`).
        alpha, n_boot, seed: the comparison's level, bootstrap resamples and seed.
        workers: questions answered in parallel by the pipeline (default 1: the pipeline need not be thread-safe).
        tracking_uri: the MLflow tracking URI (default: the current one).
        plots: log the comparison's PNG plots on the parent run.
        verbose: print progress to stderr.

    Raises:
        InputError, ValueError: bad variants, data, configuration or pipeline output, found before the sweep
            generates or judges anything beyond the first question.
    """
    settings = SweepSettings(
        evaluator_config=evaluator_config, experiment=experiment, baseline=baseline, run_name=run_name,
        retriever=retriever, data_name=data_name, pipeline_version=pipeline_version, compare=compare,
        headline=headline, alpha=alpha, n_boot=n_boot, seed=seed, workers=workers, tracking_uri=tracking_uri,
        plots=plots, verbose=verbose)
    with stop_on_signals():  # Ctrl-C / SIGTERM: no new pipeline call, variant or judge request (core.stop)
        return _sweep(pipeline, variants, data, settings)


def _sweep(pipeline: Callable[..., Any], variants: Any, data: Any, settings: SweepSettings) -> SweepResult:
    compare, headline = settings.compare, settings.headline
    if isinstance(headline, str) or isinstance(compare, str):
        raise ValueError("headline= and compare= are lists of metric names, e.g. ['correctness', 'faithfulness']")
    given_name = dataset_name(data, settings.data_name) if isinstance(data, pd.DataFrame) and len(data) else None
    plan = _plan(pipeline, variants, data, settings)
    dname = given_name or dataset_name(plan.data, None)
    asked = headline if headline is not None else compare
    plan.headline = list(dict.fromkeys(asked)) if asked is not None else None
    result = SweepResult("", {}, pd.DataFrame(), plan.base, plan.recorded)
    scores: dict[str, dict[str, dict[Any, float]]] = {}
    with tracking.open_run(settings.run_name or f"sweep-{dname}-{time.strftime('%Y%m%d-%H%M%S')}") as parent:
        result.parent_run_id = parent.run_id
        parent.params({"sweep.variants": str(len(plan.names)), "sweep.baseline": plan.base[:6000],
                       "sweep.pipeline": plan.gens.identity[:6000], "sweep.data": dname,
                       "sweep.rows": str(len(plan.data)),
                       "sweep.grid": json.dumps([{k: shown_value(v) for k, v in p.items()}
                                                 for p in plan.recorded.values()], ensure_ascii=False)[:6000]})
        parent.tags({"ragjudge.sweep": "parent"})
        parent.dataset(plan.data, dname)
        for i, name in enumerate(plan.names):
            if stop_requested():
                break
            _variant(plan, i, name, parent, dname, result, scores)
        result.stopped = stop_reason()
        # step 3: the comparison on the parent
        comparison = (paired_comparison(scores, plan.base, metrics=compare, alpha=settings.alpha,
                                        n_boot=settings.n_boot, seed=settings.seed)
                      if plan.base in scores else pd.DataFrame(columns=list(COLUMNS)))
        result.comparison = comparison
        figures = (comparison_figures(scores, comparison, plan.base, alpha=settings.alpha, seed=settings.seed,
                                      headline=plan.headline or ())
                   if settings.plots and len(comparison) else {})
        log_comparison(parent.run_id, comparison, figures)
        parent.metrics({"sweep/significant_differences": float(len(result.significant()))})
        result.prompts = {n: {k: f"prompts:/{pv.name}/{pv.version}" for k, pv in pvs.items()}
                          for n, pvs in zip(plan.names, plan.prompt_versions) if pvs}
        if result.stopped:
            parent.tags({"ragjudge.status": "interrupted",
                         "ragjudge.interrupted": f"stopped by {result.stopped} after {len(result.run_ids)} of "
                                                 f"{len(plan.names)} variants; re-run the sweep to finish (answers and "
                                                 "judge replies already paid for come from the cache)"})
    if result.stopped:
        tracking.mark_killed(result.parent_run_id)
    return result
