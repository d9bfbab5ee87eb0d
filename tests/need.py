"""A test that cannot get a component it needs: skipped on a developer's machine, failed in CI.

In CI (`CI=true`) every component is installed by hack/setup.sh, so a missing one is a broken set-up,
never a reason to go green. A component that is installed but fails to start is not "missing": it
raises, and the test fails everywhere.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing(component: str, why: object) -> NoReturn:
    """Stop the current test: `component` cannot be had here, because `why`."""
    message = f"{component} is not available: {why}"
    if in_ci():
        pytest.fail(f"{message} (CI installs every component with hack/setup.sh; this is a set-up failure)",
                    pytrace=False)
    pytest.skip(message)
