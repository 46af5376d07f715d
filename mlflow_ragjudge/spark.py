"""Evaluations that run on Spark: :func:`evaluate_spark` scores the rows of a Spark DataFrame in the executors and
logs one MLflow run from the driver (:mod:`mlflow_ragjudge.adapters.spark`). Needs the ``spark`` extra:
``pip install 'mlflow-ragjudge[spark]'``."""

from .adapters.spark import DEFAULT_TABLE_ROWS, SparkEvaluation, evaluate_spark

__all__ = ["evaluate_spark", "SparkEvaluation", "DEFAULT_TABLE_ROWS"]
