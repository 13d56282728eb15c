"""The one place the Hypothesis profiles are defined: the root conftest.py, rtpo/verify/conftest.py and
tests/test_mutants.py all call load_profile().

`ci` (the default) is deterministic: derandomized, no example database, no deadline (2 shared cores
make timings meaningless), the too_slow health check off (data generation is slow on a loaded machine,
never wrong), failing examples printed as blobs to replay.  `dev` explores randomly with more examples.
Select with HYPOTHESIS_PROFILE=dev.
"""

from __future__ import annotations

import os

PROFILES = ("ci", "dev")
DEFAULT = "ci"


def register_profiles() -> None:
    """Register `ci` and `dev` (registering again replaces them with the same settings)."""
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci",
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile("dev", max_examples=200, deadline=None, print_blob=True)


def load_profile(name: str | None = None) -> str:
    """Register the profiles and load `name` (default: HYPOTHESIS_PROFILE, else ci); returns its name.
    A name that is not one of PROFILES is a one-line ValueError, not a silent fallback."""
    from hypothesis import settings

    chosen = (name or os.environ.get("HYPOTHESIS_PROFILE", "") or DEFAULT).strip()
    if chosen not in PROFILES:
        raise ValueError(f"HYPOTHESIS_PROFILE: unknown profile {chosen!r} (valid: {', '.join(PROFILES)})")
    register_profiles()
    settings.load_profile(chosen)
    return chosen
