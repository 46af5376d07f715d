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
   registry), refuses a parameter the pipeline cannot take (``question``, or one its signature lacks), then
   calls the pipeline once, on the first question of the first variant (the next one when it raises there: the
   failure is recorded for that row), and dry-runs the evaluation of that row: a bad setting or a pipeline that
   returns the wrong thing is an error before the sweep generates or judges anything more;
2. opens a **parent run**, then for each variant a **nested child run** named from the parameters that differ
   between the variants, short enough for the MLflow UI's runs table (``cs=64,top_k=3``; all of them are recorded
   whole as ``variant.<name>`` params; the headline means are logged first, as ``_headline/<metric>``): the
   pipeline answers every question (generations are **cached** like judge calls, keyed by the pipeline's code,
   the variant's parameters and the question), the ``ragjudge`` evaluator judges the answers (the judge-call
   cache makes an unchanged variant free to re-judge), and the child logs the parameters,
   the dataset, the linked prompt versions, the generations (``ragjudge/generations.json``) and everything the
   evaluator logs. A question the pipeline fails on is recorded with its error and left out of that variant;
   the sweep goes on (a variant that failed on more than ``max_error_rate`` of its questions is in
   ``result.generation_failures``). A parameter value that is an object is keyed by its identity
   (:func:`~mlflow_ragjudge.workflows.sweep.variants.identity`: a ``cache_key`` attribute, or ``(label, obj)``);
   run names are short and unique (a hash suffix where needed);
3. logs on the parent the **paired comparison** of every variant against the baseline
   (:mod:`mlflow_ragjudge.workflows.compare`: ``ragjudge/comparison.json`` and PNG plots under ``ragjudge/plots/``).

Re-running a sweep with one variant changed or added generates and judges only that variant: the others come
from the caches (the result's ``generation`` counts say how many answers were generated and how many read back).
"""

from .generation import OUTPUT_KEYS
from .result import SweepResult
from .run import GENERATIONS_FILE, dataset_name, sweep
from .variants import PromptTemplate, expand_variants, variant_name, variant_names

__all__ = ["sweep", "SweepResult", "PromptTemplate", "expand_variants", "variant_name", "variant_names",
           "GENERATIONS_FILE", "OUTPUT_KEYS", "dataset_name"]
