"""Experiments built on mlflow-ragjudge's public API (SPEC sections 1, 2.8).

* :mod:`experiments.toy_rag` - a small RAG system in pure Python (word chunking, BM25, an optional
  query-coverage reranker, an LLM or an offline extractive generator).
* :mod:`experiments.sweep_variants` - chunk size x top-k x reranker (x prompt style) sweep, one MLflow run
  per variant, scored by the ``ragjudge`` evaluator.
* :mod:`experiments.prompt_optimisation` - seed 004's prompt-optimisation loop: three prompt styles, the
  input/output contract, a scenario set, one MLflow run per iteration.

Run them from the repository root as ``python -m experiments.<name>`` (or ``python experiments/<name>.py``).
See docs/experiments.md.
"""
