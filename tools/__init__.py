"""Development tools of the project, beside the package and not part of it: setuptools installs
``mlflow_ragjudge*`` only (pyproject.toml), so nothing here ships, and no module of the package imports from here
(``tests/test_architecture.py`` checks both). Run them from the project's root (``python -m tools.<name>``); the
tests import them from there too (pytest puts the root on the path).

* :mod:`tools.offline_judge` -- fitting the offline judge's shipped calibration
  (``mlflow_ragjudge/data/offline_judge.json``) on public human labels, and the reports of its agreement with
  them (docs/offline-judge.md).
"""
