"""``python -m mlflow_ragjudge`` is the ``ragjudge`` command."""

from .cli import main

raise SystemExit(main())
