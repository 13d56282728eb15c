"""Constants shared by the LLM tests and their spawned worker processes.

They live outside conftest.py because a spawned child re-imports the test module by name, and in the
child `import conftest` can resolve to the repository's root conftest instead of this folder's.
"""

import importlib.util

# A training-style temperature: the recorded log-probs must follow it (processed, not raw).
TEMPERATURE = 0.9
vllm_missing = importlib.util.find_spec("vllm") is None
