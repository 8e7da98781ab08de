"""The test hooks switched on for a daemon a test starts (see
tests/support/hooks/localllm_test_hooks.py).

A daemon finds the hooks module only on the ``PYTHONPATH`` this puts in its environment (its
runners inherit it); a daemon started without it ignores every ``LOCALLLM_TEST_*`` variable, as
a user's does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from localllm.settings import hook_variables

__all__ = ["HOOKS_DIR", "asks_for_hooks", "with_hooks"]

HOOKS_DIR = Path(__file__).parent / "hooks"
"""The folder that holds the hooks module (and nothing else)."""


def asks_for_hooks(env: Mapping[str, str]) -> bool:
    """Whether ``env`` sets a test hook variable."""
    return bool(hook_variables(env))


def with_hooks(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the hooks module's folder first on its ``PYTHONPATH``."""
    path = [str(HOOKS_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONPATH": os.pathsep.join(path)}
