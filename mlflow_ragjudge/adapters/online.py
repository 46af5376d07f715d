"""Our metrics in a form MLflow's online scoring (MLflow >= 3.18, ``Scorer.register()`` / ``.start()``) can store.

MLflow's tracking server stores and runs three kinds of scorer: its built-in judges, a few third-party wrappers on an
allow-list (ragas, deepeval, ...), and functions decorated with ``@scorer``, stored as their source text and
rebuilt with ``exec()`` where they run. A class-based scorer, such as :class:`~.scorers.Faithfulness`, is refused
when registered (``Scorer must be a builtin or decorator scorer to be registered. Got ScorerKind.CLASS.``).

:func:`online_scorer` gives the ``@scorer`` form of any of our metrics: a small function whose stored source imports
this package and scores with the same :class:`~.scorers.MetricScorer`, the metric, judge and settings travelling as
the default value of one of its parameters (JSON, no secrets: the judge's API key comes from the environment the
scorer runs in). Where it runs, the package must be installed, and the judge must be reachable from there.

What MLflow 3.18's open-source server does with it (docs/online-scoring.md): it registers it when the operator has
set ``MLFLOW_SERVER_ENABLE_CUSTOM_SCORERS=true``; it starts it (online scoring) only with job containers
(``MLFLOW_JOB_CUSTOM_SCORER_EXECUTOR_BACKEND=docker``), which have no network: there only the metrics that call no
LLM (the offline judge ``offline:/lexical``, ``lexical``, ``retrieval``) can give a value, and an LLM judge's
Feedback is a failure. ``ragjudge monitor`` judges the same traces with any judge, attaching Feedback with the same
``ragjudge.judge_id`` metadata.
"""

from __future__ import annotations

import inspect
import json
import threading
import types
from typing import Any

from mlflow.genai.scorers import Scorer, scorer

from ..engine.identity import JUDGE_ID_KEY
from ..llm.backends import safe_judge_uri
from .scorers import MetricScorer, default_name

__all__ = ["already_judged", "online_scorer", "score_online"]

#: the settings an online scorer may carry: JSON values only (no callables: a retriever or an embedder object
#: cannot be stored as text)
_JSON = (str, int, float, bool, type(None), list, dict)

_lock = threading.Lock()
_scorers: dict[str, MetricScorer] = {}  # one per spec in a process: its judge client (connections, cache) is reused


def online_scorer(metric: str, judge: str | None = None, *, name: str | None = None, cache: Any = False,
                  **config: Any) -> Scorer:
    """The ``@scorer`` form of ``metric`` judged by ``judge``, for ``.register()`` / ``.start()`` on an MLflow
    tracking server (MLflow >= 3.18) or anywhere a scorer's serialized form is what travels.

    Args:
        metric: a registered metric (``faithfulness``, ``answer_relevancy``, ``lexical`` ...).
        judge: the judge URI (``openai:/gpt-4o-mini``, ``openai:/m?base_url=http://host:port/v1``,
            ``offline:/lexical``), or None for a metric that calls no judge. No credentials in it: the scorer is
            stored as text in the tracking store; the API key is read from the environment where it runs
            (``OPENAI_API_KEY`` ...).
        name: the Feedback's (and registered scorer's) name; default as :class:`~.scorers.MetricScorer`'s.
        cache: the judge client's cache (default off: a job container's file system may be read-only).
        **config: the scorer's settings (``language``, ``repeats``, ``context_mode`` ...), JSON values only.

    The scorer reads the question, answer and retrieved contexts from each trace as the class-based scorers do,
    and the gold answer (for ``correctness``, ``context_recall``) from the expectations logged on the trace.
    """
    if judge is not None and not isinstance(judge, str):
        raise ValueError(f"an online scorer's judge is a URI (a string), got {type(judge).__name__}")
    if judge is not None and safe_judge_uri(judge) != judge:
        raise ValueError("an online scorer is stored as text in the tracking store: give the judge URI without "
                         "credentials (" + str(safe_judge_uri(judge)) + ") and set the API key in the environment "
                         "where the scorer runs")
    bad = sorted(k for k, v in config.items() if not isinstance(v, _JSON))
    if bad:
        raise ValueError(f"an online scorer's settings must be JSON values; not: {', '.join(bad)}")
    spec = {"metric": metric, "judge": judge, "name": name, "cache": cache, "config": config}
    text = json.dumps(spec, sort_keys=True)
    built = _scorer_for(text)  # refuses a bad metric, judge or setting now, not on the server
    # the same code with this spec as the default of ``ragjudge``: in the defaults (called here) and in the signature
    # (what MLflow stores and rebuilds the function from elsewhere)
    func = types.FunctionType(ragjudge_online.__code__, ragjudge_online.__globals__, ragjudge_online.__name__,
                              (*(ragjudge_online.__defaults__ or ())[:-1], text))
    sig = inspect.signature(ragjudge_online)
    func.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(default=text) if p.name == "ragjudge" else p for p in sig.parameters.values()])
    return scorer(func, name=built.name)


def ragjudge_online(inputs=None, outputs=None, trace=None, ragjudge="{}"):  # type: ignore[no-untyped-def]
    # MLflow stores this body as text and rebuilds the function from it where the scorer runs: it imports what it
    # needs itself, and ``ragjudge`` (the metric, judge and settings as JSON) comes from the stored signature.
    from mlflow_ragjudge.adapters.online import score_online

    return score_online(ragjudge, inputs=inputs, outputs=outputs, trace=trace)


def _scorer_for(spec: str) -> MetricScorer:
    with _lock:
        found = _scorers.get(spec)
    if found is None:
        s = json.loads(spec)
        found = MetricScorer(s["metric"], s["judge"], name=s["name"] or default_name(s["metric"], s["judge"]),
                             cache=s["cache"], **s["config"])
        with _lock:
            found = _scorers.setdefault(spec, found)
    return found


def score_online(spec: str, *, inputs: Any = None, outputs: Any = None, trace: Any = None) -> Any:
    """Score one trace with the scorer ``spec`` describes (what :func:`online_scorer`'s stored function calls).

    A trace that already carries, for every result of this scorer, a Feedback of the same name and judge identity
    (``ragjudge.judge_id``, e.g. attached by ``ragjudge monitor``) that is not an error is not judged again: None
    (MLflow logs nothing for it)."""
    scorer_ = _scorer_for(spec)
    expectations: dict[str, Any] = {}
    if trace is not None and hasattr(trace, "search_assessments"):
        if already_judged(scorer_, trace):
            return None
        for a in trace.search_assessments(type="expectation"):
            expectations.setdefault(a.name, getattr(a, "value", None))
    return scorer_(inputs=inputs, outputs=outputs, expectations=expectations or None, trace=trace)


def already_judged(scorer_: MetricScorer, trace: Any) -> bool:
    """Whether ``trace`` has, for each of the scorer's results (name -> its judge identity), a Feedback of that name
    whose ``ragjudge.judge_id`` metadata is the scorer's and which is not an error."""
    outputs = scorer_._single_names()
    names = [scorer_.name] if outputs == [scorer_._spec.name] else outputs
    done = {(a.name, (a.metadata or {}).get(JUDGE_ID_KEY)) for a in trace.search_assessments(type="feedback")
            if getattr(a, "error", None) is None}
    return all((name, scorer_.identity(out)[JUDGE_ID_KEY]) in done for name, out in zip(names, outputs, strict=True))
