"""mlflow-ragjudge: research-faithful RAG evaluation judges for MLflow.

Plain Python::

    import mlflow_ragjudge as rj
    out = rj.evaluate_frame(df, judge="openai:/gpt-4o-mini")
    out.metrics["correctness/mean"]

Variants of your RAG system, each an MLflow run, compared (docs/sweeps.md)::

    result = rj.sweep(pipeline, {"top_k": [3, 5]}, questions_df, evaluator_config={"judge": "offline:/lexical"})
    result.comparison

Numbers a team can defend: a random sample of human labels turns judge scores into valid intervals
(docs/calibration.md)::

    rj.label_sample(result.parent_run_id, 100, path="labels.csv")     # people fill the metric columns
    rj.calibrate(result.parent_run_id, "labels.csv").summary()          # ppi_mean / ppi_diff with intervals

MLflow: ``mlflow.models.evaluate(data=df, predictions="answer", targets="reference",
model_type="rag", evaluators="ragjudge", evaluator_config={"judge": ...})``.

The package is layered (docs/architecture.md): ``core`` < ``llm`` < ``metrics`` < ``engine`` < ``adapters`` <
``workflows`` < ``cli``. Importing it loads none of them: every public name below is imported when first used
(PEP 562), so ``import mlflow_ragjudge`` loads neither pandas nor mlflow. Module paths of earlier releases that the
docs show (``mlflow_ragjudge.scorers``, ``mlflow_ragjudge.client`` ...) stay importable as aliases of the modules
that now hold them (:data:`MOVED`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from typing import Any

from .core.constants import VERSION as __version__

#: public name -> the module that defines it
_PUBLIC = {
    "Aggregate": "core.types", "FailureReason": "core.types", "JudgeResult": "core.types", "Status": "core.types",
    "aggregate": "core.types", "InputError": "core.errors", "RagJudgeError": "core.errors",
    "Interrupted": "core.errors",
    "Backend": "llm.backends", "BackendError": "llm.backends", "FakeBackend": "llm.backends",
    "resolve_backend": "llm.backends", "CallCache": "llm.cache", "JudgeClient": "llm.client",
    "CorrectnessJudge": "metrics.correctness", "DEFAULT_OFFLINE_JUDGE": "core.constants",
    "OfflineJudge": "metrics.offline", "MetricSpec": "metrics.spec", "register_metric": "metrics.spec",
    "RagJudgeConfig": "engine.config", "EvalOutput": "engine.evaluate", "evaluate_frame": "engine.evaluate",
    "CalibratedEstimate": "engine.ppi", "LabelsOnlyEstimate": "engine.ppi", "TooFewLabels": "engine.ppi",
    "labels_needed": "engine.ppi", "labels_only_mean": "engine.ppi", "ppi_mean": "engine.ppi",
    "ppi_paired_diff": "engine.ppi", "load_output": "adapters.run_load",
    "PromptTemplate": "workflows.sweep", "SweepResult": "workflows.sweep", "sweep": "workflows.sweep",
    "compare_runs": "workflows.compare", "label_sample": "workflows.calibration",
    "calibrate": "workflows.calibration",
}
#: public submodules reachable as attributes (``from mlflow_ragjudge import example_rag``)
_SUBMODULES = {"example_rag": "workflows.example_rag"}

#: module paths of earlier releases -> where the module is now (``import mlflow_ragjudge.scorers`` keeps working)
MOVED = {
    "types": "core.types", "text": "core.text", "claims": "core.claims",
    "backends": "llm.backends", "backends.base": "llm.backends.base", "backends.openai": "llm.backends.openai",
    "backends.anthropic": "llm.backends.anthropic", "backends.fake": "llm.backends.fake",
    "cache": "llm.cache", "pricing": "llm.pricing", "parsing": "llm.parsing", "prompts": "llm.prompts",
    "client": "llm.client", "batch": "llm.batch", "judged": "llm.embeddings",
    "registry": "metrics.spec", "judges": "metrics", "judges.correctness": "metrics.correctness",
    "judges.faithfulness": "metrics.faithfulness", "judges.relevancy": "metrics.answer_relevancy",
    "judges.statements": "metrics.statements",
    "lexical": "metrics.lexical", "retrieval": "metrics.retrieval",
    "multiturn": "metrics.multiturn", "offline": "metrics.offline",
    "config": "engine.config", "inputs": "engine.inputs", "evaluation": "engine.evaluate", "meta": "engine.meta",
    "ppi": "engine.ppi",
    "tracking": "adapters.tracking", "evaluator": "adapters.evaluator", "scorers": "adapters.scorers",
    "compare": "workflows.compare", "calibration": "workflows.calibration", "testset": "workflows.testset",
    "example_rag": "workflows.example_rag",
}
# (no alias for the old ``mlflow_ragjudge.sweep`` module: that name is the sweep() function)


class _AliasLoader(importlib.abc.Loader):
    """Loads an old module path as the module that now holds it: the same module object, so a name patched or
    read through either path is the same."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._spec: Any = None

    def create_module(self, spec: Any) -> Any:
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:
        module.__spec__ = self._spec  # the import system set the alias's spec on it: give the module its own back


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        prefix = __name__ + "."
        if not fullname.startswith(prefix) or fullname[len(prefix):] not in MOVED:
            return None
        real = f"{__name__}.{MOVED[fullname[len(prefix):]]}"
        is_pkg = fullname[len(prefix):] in ("backends", "prompts", "judges")
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real), is_package=is_pkg)


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    # first: an old package path (``mlflow_ragjudge.backends``) has the new folder as its __path__, where the path
    # finder would otherwise load a second copy of its submodules under the old names
    sys.meta_path.insert(0, _AliasFinder())


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{_SUBMODULES[name]}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC, *_SUBMODULES})


__all__ = ["__version__", *sorted(_PUBLIC), *sorted(_SUBMODULES)]
