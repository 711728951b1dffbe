"""`python -m autoao.cli ...`: the `autoao` command (search's --workers start workers this way)."""

from __future__ import annotations

import sys

from autoao.cli import main

sys.exit(main())
