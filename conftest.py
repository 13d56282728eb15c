"""Repository-wide pytest setup: the Hypothesis profile (rtpo.verify.profiles defines `ci`, the
deterministic default, and `dev`; HYPOTHESIS_PROFILE selects one)."""

from rtpo.verify.profiles import load_profile

load_profile()
