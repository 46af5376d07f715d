"""Examples built on mlflow-ragjudge's public API (see docs/experiments.md); copy them.

* ``retrieval_sweep.py`` - a variant sweep of a RAG system's chunking, top-k and reranker
  (``mlflow_ragjudge.sweep`` over the bundled example system, ``mlflow_ragjudge.workflows.example_rag``).
* ``prompt_iterations.py`` - seed 004's prompt-optimisation loop as a sweep over versions of one prompt in
  MLflow's prompt registry, measured with the output-contract, refusal and citation checks.

Run them as ``python experiments/<name>.py``.
"""
