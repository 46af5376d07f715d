"""The pipeline's answers in a sweep: each variant's answers to every question, cached like judge calls (keyed by
the pipeline's code, the variant's parameters and the question), a failing question recorded and left out."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...core.errors import InputError
from ...core.stop import await_until_stopped, stop_reason, stop_requested
from ...llm.cache import CallCache, cache_key
from ...metrics.contexts import passages_from_retriever
from .variants import identity

#: pipeline output keys that become evaluator columns
OUTPUT_KEYS = ("answer", "contexts", "retrieved_doc_ids", "citations", "raw_output")

class PipelineFailed(Exception):
    """The pipeline raised on one question: recorded with that row, the sweep goes on (a return value of the wrong
    kind is an :class:`InputError` instead: the pipeline's contract, refused on the probe)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        super().__init__(f"{type(error).__name__}: {str(error)[:500]}")


def pipeline_identity(pipeline: Callable[..., Any], version: str | None) -> str:
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
    extra = (json.dumps(identity(pipeline.keywords).key, sort_keys=True)  # plain keywords: the same text as before
             if isinstance(pipeline, functools.partial) else "")
    return f"{name}#{digest}{'|' + extra if extra else ''}{'|' + version if version else ''}"

def normalise(out: Any, where: str) -> dict[str, Any]:
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

class Generations:
    """Pipeline answers, cached in the judge-call cache (``cache`` as the evaluator takes it)."""

    def __init__(self, pipeline: Callable[..., Any], identity: str, cache_setting: Any) -> None:
        self.pipeline = pipeline
        self.identity = identity
        self.cache = None
        if cache_setting:
            self.cache = CallCache.open(None if cache_setting is True else cache_setting)

    def key(self, question: str, params_key: str) -> str:
        return cache_key("generation", {"pipeline": self.identity}, {"question": question, "params": params_key})

    def get(self, question: str, kwargs: dict[str, Any], params_key: str | None,
            where: str) -> tuple[dict[str, Any], bool]:
        """``(output, from_cache)``; :class:`PipelineFailed` when the pipeline raises, an InputError for a bad return
        value. ``params_key`` None: the parameters have no stable identity, so the cache is neither read nor
        written."""
        key = None if params_key is None or self.cache is None else self.key(question, params_key)
        if key is not None:
            hit = self.cache.get(key)  # type: ignore[union-attr]
            if hit is not None:
                return hit, True
        try:
            raw = self.pipeline(question, **kwargs)
        except Exception as e:
            raise PipelineFailed(e) from e
        out = normalise(raw, where)
        if key is not None:
            self.cache.put(key, out)  # type: ignore[union-attr]
        return out, False

def retriever_for(retriever: Callable[..., Any] | None, kwargs: dict[str, Any]) -> Callable[[str], Any] | None:
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

def generate(gens: Generations, questions: list[str], kwargs: dict[str, Any], pkey: str | None, name: str,
             workers: int, done: Mapping[int, tuple[dict[str, Any], bool] | str],
             timings: dict[int, float] | None = None
             ) -> tuple[list[dict[str, Any] | None], list[str | None], list[bool]]:
    """Every question's answer for one variant: ``(outputs, errors, from_cache)``, None / the error for a
    question the pipeline failed on (the variant goes on); ``done`` holds answers (or errors) already in hand.
    ``timings`` (when given) gets the seconds each question took here (the pipeline call, or the cache)."""
    outs: list[dict[str, Any] | None] = [None] * len(questions)
    errors: list[str | None] = [None] * len(questions)
    cached = [False] * len(questions)
    for j, got in done.items():
        if isinstance(got, str):
            errors[j] = got
        else:
            outs[j], cached[j] = got

    def one(j: int) -> None:
        if outs[j] is not None or errors[j] is not None:
            return
        if stop_requested():  # Ctrl-C / SIGTERM: no new pipeline call
            errors[j] = f"interrupted: not generated, the sweep was stopped ({stop_reason()})"
            return
        t0 = time.perf_counter()
        try:
            outs[j], cached[j] = gens.get(questions[j], kwargs, pkey, f"row {j} of variant {name!r}")
        except Exception as e:
            errors[j] = str(e) if isinstance(e, PipelineFailed) else f"{type(e).__name__}: {str(e)[:500]}"
        if timings is not None:
            timings[j] = time.perf_counter() - t0

    if workers > 1:
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ragjudge-gen")
        try:
            futures = {pool.submit(one, j): j for j in range(len(questions))}
            unfinished = await_until_stopped(futures)
            if unfinished:  # stopped: a pipeline call that hangs is not waited for (nor is its late answer taken)
                outs, errors, cached = list(outs), list(errors), list(cached)
                for f in unfinished:
                    j = futures[f]
                    outs[j] = None
                    errors[j] = errors[j] or f"interrupted: not awaited, the sweep was stopped ({stop_reason()})"
        finally:
            pool.shutdown(wait=not stop_requested(), cancel_futures=True)
    else:
        for j in range(len(questions)):
            one(j)
    return outs, errors, cached
