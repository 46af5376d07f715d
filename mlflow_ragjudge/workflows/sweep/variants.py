"""The variants of a sweep: a grid or a list of parameter dicts, their run names, and the prompt templates they carry
(registered in MLflow's prompt registry through :mod:`mlflow_ragjudge.adapters.tracking`)."""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...adapters import tracking
from ...core.errors import InputError

__all__ = ["PromptTemplate", "Identity", "identity", "is_labelled", "shown_value", "expand_variants", "variant_name",
           "variant_names", "params_key", "unstable_params", "resolve_prompts", "MAX_NAME"]


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

#: a run name longer than this is cut, and ends in `` #`` and 8 hex digits of the variant's full parameters
MAX_NAME = 100
_PLAIN = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Identity:
    """What identifies a parameter value across runs: ``key`` (JSON-able; the generation cache and the duplicate
    check use it), ``shown`` (the text in run names and params) and whether ``key`` holds in another process."""

    key: Any
    shown: str
    stable: bool = True


def _code_identity(obj: Any) -> str:
    """A function's or class's identity: its qualified name and a hash of its source (editing it changes it)."""
    name = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        source = ""
    return f"{name}#{hashlib.sha256(source.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def is_labelled(value: Any) -> bool:
    """``(label, object)``: a 2-tuple of a text label and a value that is not plain data (an object, a function);
    the pipeline gets the object, the run name and the cache key the label."""
    return (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and bool(value[0].strip())
            and not isinstance(value[1], (*_PLAIN, list, tuple, dict, PromptTemplate)))


def identity(value: Any) -> Identity:
    """A parameter value's identity (docs/sweeps.md, "Parameters that are objects"): plain data by its JSON; a
    :class:`PromptTemplate` by its name and text; ``(label, object)`` by the label; an object with a ``cache_key``
    attribute (text, or a method returning text) by it; a function or class by its qualified name and source; an
    enum member by its name. Any other object has no identity that survives the process (``repr`` shows its
    address): ``stable`` is False."""
    if isinstance(value, _PLAIN):
        if isinstance(value, float) and value != value:
            return Identity("NaN", "NaN")
        return Identity(value, value if isinstance(value, str) else json.dumps(value))
    if isinstance(value, PromptTemplate):
        return Identity([value.name, value.template], f"{value.name}@new")
    if is_labelled(value):
        return Identity({"label": value[0]}, value[0])
    if isinstance(value, (list, tuple)):
        parts = [identity(v) for v in value]
        return Identity([p.key for p in parts], "[" + ", ".join(p.shown for p in parts) + "]",
                        all(p.stable for p in parts))
    if isinstance(value, Mapping):
        items = [(str(k), identity(v)) for k, v in value.items()]
        return Identity({k: p.key for k, p in items}, "{" + ", ".join(f"{k}: {p.shown}" for k, p in items) + "}",
                        all(p.stable for _, p in items))
    given = getattr(value, "cache_key", None)
    if callable(given) and not isinstance(value, type):
        given = given()
    if isinstance(given, str) and given.strip():
        return Identity({"cache_key": given, "type": type(value).__qualname__}, given)
    if isinstance(value, enum.Enum):
        return Identity({"enum": f"{type(value).__module__}.{type(value).__qualname__}.{value.name}"},
                        f"{type(value).__name__}.{value.name}")
    if inspect.isfunction(value) or inspect.isclass(value) or inspect.isbuiltin(value):
        return Identity({"code": _code_identity(value)}, getattr(value, "__qualname__", repr(value)))
    if isinstance(value, functools.partial):
        inner = identity((value.func, value.args, value.keywords))
        return Identity({"partial": inner.key}, f"partial({identity(value.func).shown})", inner.stable)
    # no identity beyond this process: keyed by its address (never a wrong cache hit), shown by its class
    return Identity({"object": f"{type(value).__module__}.{type(value).__qualname__}@{id(value)}"},
                    type(value).__name__, stable=False)


def shown_value(value: Any) -> str:
    """A parameter value as run names and ``variant.<name>`` params show it (never an ``object at 0x...``)."""
    return identity(value).shown


def params_key(params: Mapping[str, Any]) -> str:
    """A variant's parameters as the text the generation cache and the duplicate check key on (plain data as its
    JSON, so the keys of earlier releases hold; see :func:`identity` for everything else)."""
    return json.dumps({k: identity(v).key for k, v in params.items()}, sort_keys=True, ensure_ascii=False)


def unstable_params(params: Mapping[str, Any]) -> list[str]:
    """The parameters whose values have no identity that holds across runs."""
    return [k for k, v in params.items() if not identity(v).stable]


def _suffix(params: Mapping[str, Any]) -> str:
    return " #" + hashlib.sha256(params_key(params).encode("utf-8", "surrogatepass")).hexdigest()[:8]


def variant_name(params: Mapping[str, Any]) -> str:
    """A run name from a variant's parameters, in their order: ``chunk_size=64, top_k=3`` (``baseline`` for a
    variant with none); over :data:`MAX_NAME` characters it is cut and ends in `` #<8 hex digits>`` of the full
    parameters, so two long names that agree on their beginning stay apart."""
    if not params:
        return "baseline"
    name = ", ".join(f"{k}={shown_value(v)}" for k, v in params.items())
    if len(name) > MAX_NAME:
        name = name[: MAX_NAME - 13].rstrip() + "..." + _suffix(params)
    return name


def variant_names(param_list: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each variant's run name from the parameters that vary across the variants (one that every variant sets to
    the same value is recorded as a param of each child run, not repeated in every name); with a single
    variant, all of them. Names are unique: variants whose names would agree (``1`` and ``"1"``, two objects
    shown by one class name) end in `` #<8 hex digits>`` of their full parameters."""
    if len(param_list) < 2:
        return [variant_name(p) for p in param_list]
    keys = list(dict.fromkeys(k for p in param_list for k in p))
    same = {k for k in keys if all(k in p for p in param_list)
            and len({json.dumps(identity(p[k]).key, sort_keys=True) for p in param_list}) == 1}
    names = [variant_name({k: v for k, v in p.items() if k not in same}) for p in param_list]
    clash = {n for n in names if names.count(n) > 1}
    return [n + _suffix(p) if n in clash else n for n, p in zip(names, param_list)]


def _register_prompt(p: PromptTemplate) -> Any:
    """The registry's version of ``p``: an existing version with the same text, else a new one."""
    return tracking.register_prompt(p.name, p.template, p.commit_message or "registered by a ragjudge sweep")

def resolve_prompts(variants: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """Per variant: the pipeline's keyword arguments (prompt templates as their text, ``(label, object)`` as the
    object), the prompt versions, and the generation cache's key of its parameters (:func:`params_key`: a template
    by its text, a labelled object by its label)."""
    kwargs_list, versions, keys = [], [], []
    memo: dict[Any, Any] = {}
    for params in variants:
        kwargs, found, keyed = {}, {}, {}
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
                kwargs[k] = v[1] if is_labelled(v) else v
                keyed[k] = v
                continue
            kwargs[k] = keyed[k] = pv.template if isinstance(pv.template, str) else json.dumps(pv.template)
            found[k] = pv
        kwargs_list.append(kwargs)
        versions.append(found)
        keys.append(params_key(keyed))
    return kwargs_list, versions, keys
