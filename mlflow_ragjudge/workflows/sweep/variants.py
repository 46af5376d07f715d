"""The variants of a sweep: a grid or a list of parameter dicts, their run names, and the prompt templates they carry
(registered in MLflow's prompt registry through :mod:`mlflow_ragjudge.adapters.tracking`)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...adapters import tracking
from ...core.errors import InputError

__all__ = ["PromptTemplate", "expand_variants", "variant_name", "variant_names", "params_key", "resolve_prompts"]


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

def _register_prompt(p: PromptTemplate) -> Any:
    """The registry's version of ``p``: an existing version with the same text, else a new one."""
    return tracking.register_prompt(p.name, p.template, p.commit_message or "registered by a ragjudge sweep")

def resolve_prompts(variants: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per variant: the pipeline's keyword arguments (prompt templates as their text) and the prompt versions."""
    kwargs_list, versions = [], []
    memo: dict[Any, Any] = {}
    for params in variants:
        kwargs, found = {}, {}
        for k, v in params.items():
            if isinstance(v, PromptTemplate):
                pv = memo.get(v) or memo.setdefault(v, _register_prompt(v))
            elif isinstance(v, str) and v.startswith("prompts:/"):
                try:
                    pv = memo.get(v) or memo.setdefault(v, tracking.load_prompt(v))
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

def params_key(kwargs: Mapping[str, Any]) -> str:
    return json.dumps(kwargs, sort_keys=True, ensure_ascii=False, default=repr)
