"""autoao.evaluators: see ARCHITECTURE.md."""

from __future__ import annotations

if __name__ != "autoao.evaluators":  # the bare name from the checkout's root: the installed package's
    from autoao.common import step_aside

    step_aside(__name__, __file__)
