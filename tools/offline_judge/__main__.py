"""``python -m tools.offline_judge fit|report --data DIR`` (from the project's root)."""

from .fit import main

raise SystemExit(main())
