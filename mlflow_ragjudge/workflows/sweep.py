"""Variant sweeps: your RAG system, every variant an MLflow run, the differences tested.

::

    import mlflow_ragjudge as rj

    def pipeline(question, *, chunk_size, top_k, prompt):      # your RAG system
        ...
        return {"answer": text, "contexts": passages, "retrieved_doc_ids": ids, "citations": cited}

    result = rj.sweep(pipeline, {"chunk_size": [256, 512], "top_k": [3, 5]}, questions_df,
                      evaluator_config={"judge": "openai:/gpt-4o-mini"}, experiment="my-rag")
    result.comparison        # every variant against the baseline, per metric, with intervals and p-values

What a sweep does, in this order:

1. **checks** the variants, the data, the configuration and the tracking store, registers the prompt templates
   the variants carry (:class:`PromptTemplate`, or ``prompts:/name/version`` URIs of the MLflow prompt
   registry), then calls the pipeline once, on the first question of the first variant, and dry-runs the
   evaluation of that row: a bad setting or a pipeline that returns the wrong thing is an error before the
   sweep generates or judges anything more;
2. opens a **parent run**, then for each variant a **nested child run** named from the parameters that differ
   between the variants (``chunk_size=64, top_k=3``; all of them are recorded as ``variant.<name>`` params): the
   pipeline answers every question (generations are **cached** like judge calls, keyed by the pipeline's code,
   the variant's parameters and the question), the ``ragjudge`` evaluator judges the answers (the judge-call
   cache makes an unchanged variant free to re-judge), and the child logs the parameters,
   the dataset, the linked prompt versions, the generations (``ragjudge/generations.json``) and everything the
   evaluator logs. A question the pipeline fails on is recorded with its error and left out of that variant;
   the sweep goes on;
3. logs on the parent the **paired comparison** of every variant against the baseline
   (:mod:`mlflow_ragjudge.compare`: ``ragjudge/comparison.json`` and PNG plots under ``ragjudge/plots/``).

Re-running a sweep with one variant changed or added generates and judges only that variant: the others come
from the caches (the result's ``generation`` counts say how many answers were generated and how many read back).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..adapters.evaluator import log_output, save_local
from ..adapters.tracking import check_tracking_store
from ..core.constants import is_offline_judge
from ..core.errors import InputError, LoggingFailed
from ..engine.config import RagJudgeConfig
from ..engine.evaluate import EvalOutput, evaluate_frame
from ..engine.inputs import passages_from_retriever
from ..llm.cache import CallCache, cache_key
from .calibration import calibrate, label_sample
from .compare import COLUMNS, comparison_figures, log_comparison, paired_comparison, scores_by_row

__all__ = ["sweep", "SweepResult", "PromptTemplate", "expand_variants", "variant_name", "variant_names",
           "GENERATIONS_FILE"]

GENERATIONS_FILE = "ragjudge/generations.json"
#: pipeline output keys that become evaluator columns
OUTPUT_KEYS = ("answer", "contexts", "retrieved_doc_ids", "citations", "raw_output")


@dataclass(frozen=True)
class PromptTemplate:
    """A generator prompt a variant carries: registered in MLflow's prompt registry under ``name`` (a new version
    only when the text differs from every existing version) and given to the pipeline as its ``template`` text;
    the child run records and links the version. In a grid file: ``{"name": ..., "template": ...}``."""

    name: str
    template: str
    commit_message: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError("PromptTemplate needs a name, e.g. PromptTemplate('rag-answer', '...')")
        if not isinstance(self.template, str) or not self.template.strip():
            raise ValueError(f"PromptTemplate {self.name!r} has an empty template")


@dataclass
class SweepResult:
    """What a sweep produced.

    Attributes:
        parent_run_id: the parent run (the comparison and plots are there).
        run_ids: variant name -> child run id.
        comparison: the paired comparison (:data:`mlflow_ragjudge.compare.COLUMNS`).
        baseline: the baseline variant's name.
        variants: variant name -> its parameters as recorded (a prompt as ``name@v<version>``).
        outputs: variant name -> its evaluation (:class:`EvalOutput`), None for a variant with no answer at all.
        generation: variant name -> ``{"rows", "generated", "cached", "failed", "seconds"}``.
        prompts: variant name -> parameter -> ``prompts:/<name>/<version>``.
        errors: variant name -> why its answers could not be evaluated (e.g. a metric asked for by name whose
            column this variant's pipeline output lacks); the sweep goes on without it.
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
                lines.append(f"  {r['metric']:<22} {r['variant']:<36} diff {r['mean_diff']:+.3f} {ci}  p_holm {p} "
                             f" w/t/l {r['wins']}/{r['ties']}/{r['losses']}  n={r['n']}{mark}")
            if len(moved) > 12:
                lines.append(f"  ... {len(moved) - 12} more with a difference")
            if len(table) > len(moved):
                lines.append(f"  {len(table) - len(moved)} comparison(s) with no difference at all")
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

    def label_sample(self, n: int = 100, **kwargs: Any) -> pd.DataFrame:
        """A seeded random sample of the sweep's questions, in every variant, to label blind
        (:func:`mlflow_ragjudge.calibration.label_sample` on the parent run)."""
        return label_sample(self.parent_run_id, n, **kwargs)

    def calibrate(self, labels: Any, **kwargs: Any) -> Any:
        """Calibrated estimates per variant and calibrated differences against the baseline, from filled labels
        (:func:`mlflow_ragjudge.calibration.calibrate` on the parent run); ``self.comparison`` gains the columns."""
        result = calibrate(self.parent_run_id, labels, **kwargs)
        if result.comparison is not None:
            self.comparison = result.comparison
        return result

    def significant(self) -> pd.DataFrame:
        """The rows of the comparison whose difference is significant after Holm's correction."""
        return self.comparison[self.comparison["significant"] == True]  # noqa: E712 (object column)


# --------------------------------------------------------------------------- variants


def expand_variants(variants: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """A list of parameter dicts as it is, or a grid ``{param: [values]}`` as the list of every combination
    (the first parameter varies slowest).

    Raises:
        ValueError: an empty grid or list, a grid value that is not a list, a parameter that is not a name.
    """
    if isinstance(variants, Mapping):
        if not variants:
            raise ValueError("the grid is empty: give {param: [values]} with at least one parameter")
        for k, vals in variants.items():
            if isinstance(vals, (str, bytes)) or not isinstance(vals, Sequence) or not vals:
                raise ValueError(f"grid parameter {k!r} must map to a non-empty list of values, e.g. "
                                 f"{{{k!r}: [1, 2]}}; got {vals!r}")
        keys = list(variants)
        out = [dict(zip(keys, combo)) for combo in itertools.product(*(variants[k] for k in keys))]
    else:
        if isinstance(variants, (str, bytes)) or not isinstance(variants, Sequence):
            raise ValueError("variants must be a list of parameter dicts or a grid {param: [values]}")
        out = []
        for i, v in enumerate(variants):
            if not isinstance(v, Mapping):
                raise ValueError(f"variant {i} is a {type(v).__name__}; each variant is a dict of parameters")
            out.append(dict(v))
        if not out:
            raise ValueError("variants is empty: give at least one variant")
    for i, v in enumerate(out):
        for k in v:
            if not isinstance(k, str) or not k.isidentifier():
                raise ValueError(f"variant {i} has parameter {k!r}; parameters are passed as keyword arguments, so "
                                 "each must be a Python identifier such as 'top_k'")
    return out


def _shown(value: Any) -> str:
    if isinstance(value, PromptTemplate):
        return f"{value.name}@new"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def variant_name(params: Mapping[str, Any]) -> str:
    """A run name from a variant's parameters, in their order: ``chunk_size=64, top_k=3`` (``baseline`` for a
    variant with none)."""
    if not params:
        return "baseline"
    return ", ".join(f"{k}={_shown(v)}" for k, v in params.items())[:240]


def variant_names(param_list: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each variant's run name from the parameters that vary across the variants (one that every variant sets to
    the same value is recorded as a param of each child run, not repeated in every name); with a single
    variant, all of them."""
    if len(param_list) < 2:
        return [variant_name(p) for p in param_list]
    keys = list(dict.fromkeys(k for p in param_list for k in p))
    same = {k for k in keys if all(k in p for p in param_list)
            and len({_shown(p[k]) for p in param_list}) == 1}
    return [variant_name({k: v for k, v in p.items() if k not in same}) for p in param_list]


# --------------------------------------------------------------------------- the pipeline and its cache


def _pipeline_identity(pipeline: Callable[..., Any], version: str | None) -> str:
    """What identifies a pipeline's behaviour in the generation cache: its qualified name and a hash of its
    source (editing the function invalidates its entries), plus ``pipeline_version`` for what the source does
    not show (an index rebuilt, a model behind an endpoint changed)."""
    target = inspect.unwrap(pipeline.func if isinstance(pipeline, functools.partial) else pipeline)
    if not (inspect.isfunction(target) or inspect.ismethod(target) or inspect.isbuiltin(target)):
        target = type(target)  # a callable object: its class's code decides what it returns
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__name__)}"
    try:
        source = inspect.getsource(target)
    except (OSError, TypeError):
        source = ""
    digest = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    extra = json.dumps(pipeline.keywords, sort_keys=True, default=repr) if isinstance(pipeline,
                                                                                        functools.partial) else ""
    return f"{name}#{digest}{'|' + extra if extra else ''}{'|' + version if version else ''}"


def _normalise(out: Any, where: str) -> dict[str, Any]:
    """A pipeline's return value as the evaluator's columns, or an InputError naming the fix."""
    if isinstance(out, str):
        return {"answer": out}
    if not isinstance(out, Mapping):
        raise InputError(f"The pipeline returned a {type(out).__name__} for {where}; return the answer (str) or a "
                         "dict with 'answer' and optionally 'contexts', 'retrieved_doc_ids', 'citations'.")
    if not isinstance(out.get("answer"), str):
        raise InputError(f"The pipeline's output for {where} has no text 'answer' (keys {list(out)[:6]}); return a "
                         "dict with 'answer': str.")
    got: dict[str, Any] = {"answer": out["answer"]}
    if isinstance(out.get("raw_output"), str):
        got["raw_output"] = out["raw_output"]
    if out.get("contexts") is not None:
        got["contexts"] = passages_from_retriever(out["contexts"], 0)
    for key in ("retrieved_doc_ids", "citations"):
        if out.get(key) is not None:
            value = out[key]
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                raise InputError(f"The pipeline's '{key}' for {where} is a {type(value).__name__}; it must be a "
                                 "list of document ids.")
            got[key] = [v if isinstance(v, (str, int)) else str(v) for v in value]
    return got


class _Generations:
    """Pipeline answers, cached in the judge-call cache (``cache`` as the evaluator takes it)."""

    def __init__(self, pipeline: Callable[..., Any], identity: str, cache_setting: Any) -> None:
        self.pipeline = pipeline
        self.identity = identity
        self.cache = None
        if cache_setting:
            self.cache = CallCache.open(None if cache_setting is True else cache_setting)

    def key(self, question: str, params_key: str) -> str:
        return cache_key("generation", {"pipeline": self.identity}, {"question": question, "params": params_key})

    def get(self, question: str, kwargs: dict[str, Any], params_key: str, where: str) -> tuple[dict[str, Any], bool]:
        """``(output, from_cache)``; raises what the pipeline raises, or an InputError for a bad return value."""
        key = self.key(question, params_key)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                return hit, True
        out = _normalise(self.pipeline(question, **kwargs), where)
        if self.cache is not None:
            self.cache.put(key, out)
        return out, False


# --------------------------------------------------------------------------- prompts


def _register_prompt(p: PromptTemplate) -> Any:
    """The registry's version of ``p``: an existing version with the same text, else a new one."""
    import mlflow

    try:
        latest = mlflow.genai.load_prompt(f"prompts:/{p.name}@latest", link_to_model=False)
    except Exception:
        latest = None
    if latest is not None:
        for v in range(int(latest.version), 0, -1):
            try:
                pv = mlflow.genai.load_prompt(f"prompts:/{p.name}/{v}", link_to_model=False)
            except Exception:
                continue
            if pv.template == p.template:
                return pv
    return mlflow.genai.register_prompt(p.name, p.template, commit_message=p.commit_message or "registered by a "
                                        "ragjudge sweep")


def _resolve_prompts(variants: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per variant: the pipeline's keyword arguments (prompt templates as their text) and the prompt versions."""
    import mlflow

    kwargs_list, versions = [], []
    memo: dict[Any, Any] = {}
    for params in variants:
        kwargs, found = {}, {}
        for k, v in params.items():
            if isinstance(v, PromptTemplate):
                pv = memo.get(v) or memo.setdefault(v, _register_prompt(v))
            elif isinstance(v, str) and v.startswith("prompts:/"):
                try:
                    pv = memo.get(v) or memo.setdefault(v, mlflow.genai.load_prompt(v, link_to_model=False))
                except Exception as e:
                    raise InputError(f"Prompt {v!r} could not be loaded from the MLflow prompt registry "
                                     f"({type(e).__name__}: {str(e)[:200]}); register it first, or give "
                                     "PromptTemplate(name, template).") from None
            else:
                kwargs[k] = v
                continue
            kwargs[k] = pv.template if isinstance(pv.template, str) else json.dumps(pv.template)
            found[k] = pv
        kwargs_list.append(kwargs)
        versions.append(found)
    return kwargs_list, versions


# --------------------------------------------------------------------------- the sweep


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


def _retriever_for(retriever: Callable[..., Any] | None, kwargs: dict[str, Any]) -> Callable[[str], Any] | None:
    """The variant's E3 retriever: ``retriever(query, **params)`` with the parameters it accepts."""
    if retriever is None:
        return None
    try:
        sig = inspect.signature(retriever)
    except (TypeError, ValueError):
        return functools.partial(retriever, **kwargs)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return functools.partial(retriever, **kwargs)
    return functools.partial(retriever, **{k: v for k, v in kwargs.items() if k in sig.parameters})


def _params_key(kwargs: Mapping[str, Any]) -> str:
    return json.dumps(kwargs, sort_keys=True, ensure_ascii=False, default=repr)


def _data_name(data: pd.DataFrame, given: str | None) -> str:
    """The dataset's name in MLflow: ``given``, else the DataFrame's own name (``df.attrs["name"]``, or a ``name``
    attribute set on it), else ``data-<hash of its first column>``."""
    if given:
        return given
    own = data.attrs.get("name") if isinstance(data.attrs, dict) else None
    own = own or data.__dict__.get("name")
    if isinstance(own, str) and own.strip():
        return own.strip()
    digest = hashlib.sha256("\x1f".join(map(str, data.iloc[:, 0].tolist())).encode("utf-8", "surrogatepass"))
    return f"data-{digest.hexdigest()[:8]}"


def _generate(gens: _Generations, questions: list[str], kwargs: dict[str, Any], name: str, workers: int,
              done: Mapping[int, tuple[dict[str, Any], bool]]) -> tuple[list[dict[str, Any] | None],
                                                                         list[str | None], list[bool]]:
    """Every question's answer for one variant: ``(outputs, errors, from_cache)``, None / the error for a
    question the pipeline failed on (the variant goes on); ``done`` holds answers already in hand."""
    outs: list[dict[str, Any] | None] = [None] * len(questions)
    errors: list[str | None] = [None] * len(questions)
    cached = [False] * len(questions)
    pkey = _params_key(kwargs)
    for j, (out, hit) in done.items():
        outs[j], cached[j] = out, hit

    def one(j: int) -> None:
        if outs[j] is not None:
            return
        try:
            outs[j], cached[j] = gens.get(questions[j], kwargs, pkey, f"row {j} of variant {name!r}")
        except Exception as e:
            errors[j] = f"{type(e).__name__}: {str(e)[:500]}"

    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ragjudge-gen") as pool:
            list(pool.map(one, range(len(questions))))
    else:
        for j in range(len(questions)):
            one(j)
    return outs, errors, cached


def _log(message: str, verbose: bool) -> None:
    if verbose:
        print(message, file=sys.stderr, flush=True)


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
    alpha: float = 0.05,
    n_boot: int = 2000,
    seed: int = 0,
    workers: int = 1,
    tracking_uri: str | None = None,
    plots: bool = True,
    verbose: bool = False,
) -> SweepResult:
    """Run every variant of ``pipeline`` over ``data``, each as a child run, and compare them (module docstring).

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
        compare: the metrics to compare (default: :func:`mlflow_ragjudge.compare.default_metrics`).
        alpha, n_boot, seed: the comparison's level, bootstrap resamples and seed.
        workers: questions answered in parallel by the pipeline (default 1: the pipeline need not be thread-safe).
        tracking_uri: the MLflow tracking URI (default: the current one).
        plots: log the comparison's PNG plots on the parent run.
        verbose: print progress to stderr.

    Raises:
        InputError, ValueError: bad variants, data, configuration or pipeline output, found before the sweep
            generates or judges anything beyond the first question.
    """
    import mlflow

    if not callable(pipeline):
        raise InputError(f"pipeline must be callable: pipeline(question, **params) -> answer; got "
                         f"{type(pipeline).__name__}.")
    if retriever is not None and not callable(retriever):
        raise InputError("retriever must be callable: retriever(query, **params) -> passages.")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} must be a whole number >= 1")
    config = dict(evaluator_config or {})
    if "retriever" in config and retriever is not None:
        raise ValueError("give the E3 retriever once: sweep(retriever=...) (called with each variant's parameters) "
                         "or evaluator_config['retriever'], not both")
    cfg = RagJudgeConfig.from_dict(config)
    given_name = data_name or (_data_name(data, None) if isinstance(data, pd.DataFrame) and len(data) else None)
    data = _check_data(data, cfg)
    param_list = expand_variants(variants)
    names = variant_names(param_list)
    keys = [_params_key({k: (v.name, v.template) if isinstance(v, PromptTemplate) else v for k, v in p.items()})
            for p in param_list]
    dupes = sorted({n for n, k in zip(names, keys) if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"variants {dupes} appear more than once; each variant must differ in its parameters")
    base_index: int | None = None
    if isinstance(baseline, int) and not isinstance(baseline, bool):
        if not 0 <= baseline < len(names):
            raise ValueError(f"baseline={baseline} is not a variant index (0..{len(names) - 1})")
        base_index = baseline
    elif baseline in names:
        base_index = names.index(str(baseline))
    elif not any(isinstance(v, PromptTemplate) or (isinstance(v, str) and v.startswith("prompts:/"))
                 for p in param_list for v in p.values()):  # a prompt variant's name is known once registered
        raise ValueError(f"baseline {baseline!r} is not one of the variants {names}")
    # the tracking store must answer before the pipeline or the judge is paid for
    check_tracking_store(tracking_uri, experiment, nothing="Nothing was generated or judged.")
    kwargs_list, prompt_versions = _resolve_prompts(param_list)
    # the parameters as recorded: a prompt as <name>@v<version>; the run names show them that way
    recorded_list = [{k: (f"{pvs[k].name}@v{pvs[k].version}" if k in pvs else v) for k, v in p.items()}
                     for p, pvs in zip(param_list, prompt_versions)]
    names = variant_names(recorded_list)
    if len(set(names)) < len(names):  # two templates that are one registered version
        raise ValueError(f"two variants are the same after resolving their prompts: {names}")
    if base_index is None:
        if baseline not in names:
            raise ValueError(f"baseline {baseline!r} is not one of the variants {names}")
        base_index = names.index(str(baseline))
    base = names[base_index]
    recorded = dict(zip(names, recorded_list))
    qcol = cfg.column("question")
    questions = data[qcol].tolist()
    gens = _Generations(pipeline, _pipeline_identity(pipeline, pipeline_version), cfg.cache)

    # 1. the probe: one answer, one dry-run evaluation
    first, first_cached = gens.get(questions[0], kwargs_list[0], _params_key(kwargs_list[0]),
                                   f"row 0 of variant {names[0]!r}")
    probe = data.iloc[:1].copy()
    for k, v in first.items():
        probe[cfg.column(k)] = [v]
    evaluate_frame(probe, {**config, "dry_run": True, "progress": False,
                           "retriever": _retriever_for(retriever, kwargs_list[0]) or config.get("retriever")})

    dname = _data_name(data, given_name)
    parent_name = run_name or f"sweep-{dname}-{time.strftime('%Y%m%d-%H%M%S')}"
    logged_data = data.copy()
    for col in logged_data.columns:  # MLflow's dataset schema wants plain cells: lists as JSON text
        if logged_data[col].map(lambda v: isinstance(v, (list, dict, tuple))).any():
            logged_data[col] = logged_data[col].map(lambda v: json.dumps(v, ensure_ascii=False, default=str)
                                                    if isinstance(v, (list, dict, tuple)) else v)
    from mlflow.data.pandas_dataset import from_pandas

    dataset = from_pandas(logged_data, name=dname)
    result = SweepResult("", {}, pd.DataFrame(), base, recorded)
    scores: dict[str, dict[str, dict[Any, float]]] = {}
    client = mlflow.tracking.MlflowClient()
    with mlflow.start_run(run_name=parent_name) as parent:
        result.parent_run_id = parent.info.run_id
        mlflow.log_params({"sweep.variants": str(len(names)), "sweep.baseline": base[:6000],
                           "sweep.pipeline": _pipeline_identity(pipeline, pipeline_version)[:6000],
                           "sweep.data": dname, "sweep.rows": str(len(data)),
                           "sweep.grid": json.dumps(list(recorded.values()), default=str)[:6000]})
        mlflow.set_tags({"ragjudge.sweep": "parent"})
        mlflow.log_input(dataset, context="evaluation")
        for i, (name, kwargs, pvs) in enumerate(zip(names, kwargs_list, prompt_versions)):
            _log(f"[{i + 1}/{len(names)}] {name}", verbose)
            t0 = time.perf_counter()
            # the probe already answered the first question of the first variant
            done = {0: (first, first_cached)} if i == 0 else {}
            outs, errors, cached = _generate(gens, questions, kwargs, name, workers, done)
            seconds = time.perf_counter() - t0
            ok = [j for j in range(len(questions)) if outs[j] is not None]
            gen_stats = {"rows": len(questions), "generated": sum(1 for j in ok if not cached[j]),
                         "cached": sum(1 for j in ok if cached[j]), "failed": len(questions) - len(ok),
                         "seconds": round(seconds, 3)}
            result.generation[name] = gen_stats
            _log(f"    answers: {gen_stats['generated']} generated, {gen_stats['cached']} from the cache, "
                 f"{gen_stats['failed']} failed", verbose)
            out: EvalOutput | None = None
            if ok:
                frame = data.iloc[ok].reset_index(drop=True).copy()
                for key in OUTPUT_KEYS:
                    if any(key in (outs[j] or {}) for j in ok):
                        frame[cfg.column(key)] = [(outs[j] or {}).get(key) for j in ok]
                try:
                    out = evaluate_frame(frame, {**config, "retriever": _retriever_for(retriever, kwargs)
                                                 or config.get("retriever")})
                    scores[name] = scores_by_row(out.results, rows=ok)
                except InputError as e:  # this variant's answers cannot be evaluated (the first variant's could)
                    result.errors[name] = str(e)
                    _log(f"    not evaluated: {e}", verbose)
            result.outputs[name] = out
            with mlflow.start_run(run_name=name, nested=True) as child:
                run_id = child.info.run_id
                result.run_ids[name] = run_id
                params = {f"variant.{k}": str(v)[:6000] for k, v in recorded[name].items()}
                params["variant.name"] = name
                mlflow.log_params(params)
                mlflow.set_tags({"ragjudge.sweep": "variant", "ragjudge.sweep.parent": parent.info.run_id,
                                 "ragjudge.sweep.baseline": str(name == base).lower()})
                mlflow.log_input(dataset, context="evaluation")
                mlflow.log_metrics({"generation/failed_rate": gen_stats["failed"] / len(questions),
                                    "generation/seconds": seconds, "generation/cached": gen_stats["cached"],
                                    "generation/generated": gen_stats["generated"]})
                for pv in pvs.values():
                    client.link_prompt_version_to_run(run_id, pv)
                if pvs:
                    mlflow.log_params({f"prompt.{k}": f"prompts:/{pv.name}/{pv.version}" for k, pv in pvs.items()})
                table = pd.DataFrame({
                    "question": questions,
                    "answer": [o.get("answer") if o else None for o in outs],
                    "contexts": [json.dumps(o.get("contexts"), ensure_ascii=False) if o and "contexts" in o
                                 else None for o in outs],
                    "retrieved_doc_ids": [json.dumps(o.get("retrieved_doc_ids")) if o and "retrieved_doc_ids" in o
                                          else None for o in outs],
                    "citations": [json.dumps(o.get("citations")) if o and "citations" in o else None for o in outs],
                    "generation_error": errors,
                    "from_cache": cached,
                })
                mlflow.log_table(data=table, artifact_file=GENERATIONS_FILE, run_id=run_id)
                if out is not None:
                    saved = save_local(out, f"sweep-{i}")
                    try:
                        log_output(out, run_id, saved=saved)
                    except LoggingFailed:
                        raise
                else:
                    mlflow.set_tag("ragjudge.status", "evaluation_error" if name in result.errors else "no_answers")
                    if name in result.errors:
                        mlflow.set_tag("ragjudge.evaluation_error", result.errors[name][:5000])
            _log(f"    run {run_id}", verbose)
        comparison = paired_comparison(scores, base, metrics=compare, alpha=alpha, n_boot=n_boot, seed=seed) \
            if base in scores else pd.DataFrame(columns=_columns())
        result.comparison = comparison
        figures = comparison_figures(scores, comparison, base, alpha=alpha, seed=seed) if plots and len(
            comparison) else {}
        log_comparison(parent.info.run_id, comparison, figures)
        mlflow.log_metrics({"sweep/significant_differences": float(len(result.significant()))})
        result.prompts = {n: {k: f"prompts:/{pv.name}/{pv.version}" for k, pv in pvs.items()}
                          for n, pvs in zip(names, prompt_versions) if pvs}
    return result


def _columns() -> list[str]:
    return list(COLUMNS)

