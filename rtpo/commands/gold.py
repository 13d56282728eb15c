"""`python -m rtpo.commands.gold SCENARIO --out FILE`: gold trajectories (demonstrations for `method: sft`)
for a scenario's training problems, written by stepping its own environment (rtpo.llm.gold).

    python -m rtpo.commands.gold scenarios/llm/tiny-cpu-math-sft.yaml --out scenarios/llm/data/math-gold.jsonl
    python -m rtpo.commands.gold SCENARIO --out FILE --imperfect 0.15 --seed 0 [key=value ...]

Exit 2 with one line on bad input (scenario, overrides, a task kind without gold trajectories).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def family_writer(task_kind: str) -> Callable[..., list[dict]]:
    """The demonstrations writer of a task kind."""
    from rtpo.llm.search import QA_KINDS

    if task_kind == "arithmetic":
        from rtpo.llm.gold import math_demonstrations

        return math_demonstrations
    if task_kind in QA_KINDS:
        from rtpo.llm.gold_qa import qa_demonstrations

        return qa_demonstrations
    if task_kind == "airline":
        from rtpo.llm.gold_airline import airline_demonstrations

        return airline_demonstrations
    raise ValueError(f"no gold trajectories for task.kind {task_kind!r} (arithmetic, airline or a QA kind)")


def main(argv: list[str] | None = None) -> int:
    from rtpo.llm import gold
    from rtpo.llm.build import build_env
    from rtpo.scenario.load import load_scenario
    from rtpo.scenario.schema import ConfigError

    ap = argparse.ArgumentParser(prog="python -m rtpo.commands.gold", description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario")
    ap.add_argument("overrides", nargs="*", help="key=value scenario overrides")
    ap.add_argument("--out", required=True, help="the JSONL file to write")
    ap.add_argument("--imperfect", type=float, default=0.15, help="share of imperfect trajectories")
    ap.add_argument("--seed", type=int, default=0, help="which problems get an imperfect trajectory")
    args = ap.parse_args(argv)
    try:
        if not 0.0 <= args.imperfect <= 1.0:
            raise ConfigError(f"--imperfect must be in [0, 1], got {args.imperfect}")
        cfg = load_scenario(args.scenario, args.overrides)
        writer = family_writer(cfg.task.kind)
        env = build_env(cfg, "train")
        records = writer(env, imperfect=args.imperfect, seed=args.seed)
    except (ConfigError, ValueError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    path = gold.write_demonstrations(records, args.out)
    bad = sum(r["quality"] == "imperfect" for r in records)
    print(f"{path}: {len(records)} demonstrations, {bad} imperfect")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
