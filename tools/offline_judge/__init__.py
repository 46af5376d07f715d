"""The offline judge's calibration, fitted and measured on public human labels (docs/offline-judge.md)::

    python -m tools.offline_judge report --data ../shared/data --splits 20   # the tables docs/offline-judge.md quotes
    python -m tools.offline_judge fit --data ../shared/data --out mlflow_ragjudge/data/offline_judge.json

* :mod:`.public_data` reads the public data sets (OpenQA-eval NQ301, MTRAG) and cuts them into the fit half and the
  held-out half;
* :mod:`.fit` fits the calibration (the logistic models, the cut-points, the support threshold) and measures it on
  the held-out half; its ``main`` is the command above;
* :mod:`.table` puts the judge beside the lexical baselines on every set.

The package reads only the result, ``mlflow_ragjudge/data/offline_judge.json``
(:meth:`mlflow_ragjudge.metrics.offline.Calibration.shipped`); none of this is installed with it.
"""
