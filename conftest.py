"""Repository-wide pytest setup: Hypothesis profiles.

`ci` (the default) is deterministic: derandomized, no example database, no deadline (2 shared cores
make timings meaningless), failing examples printed as blobs to replay.  `dev` explores randomly with
more examples.  Select with HYPOTHESIS_PROFILE=dev.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=200, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
