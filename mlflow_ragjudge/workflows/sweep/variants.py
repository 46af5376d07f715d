"""The variants of a sweep: a grid or a list of parameter dicts, their run names, and the prompt templates they carry
(registered in MLflow's prompt registry through :mod:`mlflow_ragjudge.adapters.tracking`)."""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...adapters import tracking
from ...core.errors import InputError


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

#: a run name is never longer than this: cut, it ends in ``…#`` and 8 hex digits of the variant's full parameters
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
    JSON; see :func:`identity` for everything else)."""
    return json.dumps({k: identity(v).key for k, v in params.items()}, sort_keys=True, ensure_ascii=False)


def unstable_params(params: Mapping[str, Any]) -> list[str]:
    """The parameters whose values have no identity that holds across runs."""
    return [k for k, v in params.items() if not identity(v).stable]


def _digest(params: Mapping[str, Any], n: int) -> str:
    return hashlib.sha256(params_key(params).encode("utf-8", "surrogatepass")).hexdigest()[:n]


#: a run name the MLflow 3.17 UI shows whole in its runs table (a child run's name cell shows about 16 characters;
#: measured in Chromium); longer names are shortened -- parameter names first, then values (:func:`variant_names`)
SHORT_NAME = 16
#: a value longer than this is cut in a run name (``…``); the run's ``variant.<name>`` param keeps it whole
SHORT_VALUE = 16
_VERSION = re.compile(r"(@v\d+)$")


def short_value(value: Any) -> str:
    """A parameter value as a run name shows it: compact (no spaces in lists and dicts, floats to 4 significant
    digits), cut to :data:`SHORT_VALUE` characters with ``…`` (a prompt's ``@v<version>`` is kept)."""
    if isinstance(value, float) and value == value:
        text = format(value, ".4g")
    elif isinstance(value, (list, tuple, dict)) and identity(value).stable:
        text = shown_value(value).replace(", ", ",").replace(": ", ":")
    else:
        text = shown_value(value)
    text = " ".join(text.split())
    if len(text) <= SHORT_VALUE:
        return text
    version = _VERSION.search(text)
    tail = version.group(1) if version else ""
    return text[: SHORT_VALUE - 1 - len(tail)].rstrip() + "…" + tail


def _short_values(values: Sequence[Any]) -> list[str]:
    """One parameter's values across the variants as the names show them (:func:`short_value`); versions of one
    registered prompt (``rag-answer@v1``, ``rag-answer@v2``) show as their versions (``@v1``, ``@v2``)."""
    found = [_VERSION.search(v) if isinstance(v, str) else None for v in values]
    heads = {v[: m.start()] for v, m in zip(values, found) if m is not None}
    if len(values) > 1 and all(found) and len(heads) == 1:
        return [m.group(1) for m in found if m is not None]
    return [short_value(v) for v in values]


def short_key(key: str, level: int) -> str:
    """A parameter name as a run name shows it: whole at level 0; at level 1 a ``snake_case`` name over 6 characters
    becomes its parts' initials (``chunk_size`` -> ``cs``) and one word over 8 characters its first 4 letters
    (``temperature`` -> ``temp``); at level 2 every name over 3 characters is shortened so, one word to its first 3
    letters (``top_k`` -> ``tk``, ``style`` -> ``sty``)."""
    parts = [p for p in key.split("_") if p]
    if level == 0 or len(key) <= 3 or not parts:
        return key
    if len(parts) > 1:
        return "".join(p[0] for p in parts) if level == 2 or len(key) > 6 else key
    if level == 1:
        return key[:4] if len(key) > 8 else key
    return key[:3]


def _short_keys(keys: Sequence[str], level: int) -> dict[str, str]:
    """Each key's short form at ``level``; keys whose short forms would agree keep their whole names."""
    short = {k: short_key(k, level) for k in keys}
    taken = [short[k] for k in keys]
    return {k: (s if taken.count(s) == 1 and (s == k or s not in keys) else k) for k, s in short.items()}


def _names_at(param_list: Sequence[Mapping[str, Any]], shown: Sequence[Sequence[str]], level: int) -> list[str]:
    """The names at one level of key shortening, unique: names that agree end in ``#`` and 4 hex digits of the
    variant's full parameters (8 when 4 are not enough)."""
    keys = list(dict.fromkeys(k for ks in shown for k in ks))
    short = _short_keys(keys, level)
    values = {k: _short_values([p[k] for p, ks in zip(param_list, shown) if k in ks]) for k in keys}
    seen = dict.fromkeys(keys, 0)
    names = []
    for ks in shown:
        pairs = []
        for k in ks:
            pairs.append(f"{short[k]}={values[k][seen[k]]}")
            seen[k] += 1
        names.append(",".join(pairs) or "baseline")
    for n in (4, 8):
        clash = {x for x in names if names.count(x) > 1}
        names = [x + "#" + _digest(p, n) if x in clash else x for x, p in zip(names, param_list)]
        if len(set(names)) == len(names):
            break
    return [x if len(x) <= MAX_NAME else x[: MAX_NAME - 10] + "…#" + _digest(p, 8) for x, p in zip(names, param_list)]


def variant_name(params: Mapping[str, Any]) -> str:
    """One variant's run name from its parameters, in their order: compact ``key=value`` pairs (``top_k=3,style=plain``;
    ``baseline`` for a variant with none), shortened as :func:`variant_names` shortens them."""
    return variant_names([params])[0]


def _shown_keys(param_list: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """Per variant, the parameters its name shows: those that vary across the variants (all, for one variant)."""
    if len(param_list) < 2:
        return [list(p) for p in param_list]
    keys = list(dict.fromkeys(k for p in param_list for k in p))
    same = {k for k in keys if all(k in p for p in param_list)
            and len({json.dumps(identity(p[k]).key, sort_keys=True) for p in param_list}) == 1}
    return [[k for k in p if k not in same] for p in param_list]


def variant_names(param_list: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each variant's run name: short, unique, the same on every run (a function of the parameters only).

    The name shows the parameters that vary across the variants (one every variant sets alike is a param of each
    child run, not part of its name; a single variant shows all of them) as ``key=value`` joined by ``,``, values
    compact (:func:`short_value`). When a name is longer than :data:`SHORT_NAME` -- more than the MLflow UI's runs
    table shows of a child run -- the parameter names are shortened (:func:`short_key`): the first of levels 0 and
    1 at which every name fits, else at which the names differ within their first :data:`SHORT_NAME` - 1
    characters (what the table shows before its ``…``); only then level 2 (every name shortened), if it fits or
    keeps them apart so; else level 1. Variants whose names would agree (``1`` and ``"1"``, cut values,
    objects shown by one class name) end in ``#`` and 4 hex digits of their full parameters."""
    shown = _shown_keys(param_list)
    levels = [_names_at(param_list, shown, level) for level in (0, 1, 2)]

    def fits(names: list[str]) -> bool:
        return all(len(n) <= SHORT_NAME for n in names)

    def apart(names: list[str]) -> bool:
        return len({n[: SHORT_NAME - 1] for n in names}) == len(names)

    for test, candidates in ((fits, levels[:2]), (apart, levels[:2]), (fits, levels[2:]), (apart, levels[2:])):
        for names in candidates:
            if test(names):
                return names
    return levels[1]


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
