"""Run the benchmarks and write bench/results.json:  python bench/run.py [extra pytest args]"""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    args = [
        str(HERE),
        "-p",
        "no:cacheprovider",
        "--benchmark-enable",
        f"--benchmark-json={HERE / 'results.json'}",
        *sys.argv[1:],
    ]
    raise SystemExit(pytest.main(args))
