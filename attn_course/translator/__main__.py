"""``python -m attn_course.translator train|translate|evaluate``: see :mod:`attn_course.translator.cli`."""

from .cli import main

raise SystemExit(main())
