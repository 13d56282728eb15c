"""`rtpo plan`: what an llm scenario costs before it starts — per phase and per iteration the trunk and
sibling counts, tokens generated and trained, each worker's memory (weights, gradients and AdamW shards
under FSDP2, activations at the micro-batch, the engine's KV cache) and a time estimate on an
accelerator from a table (rtpo.plan.hardware) or a user's file.  `rtpo run` refuses a scenario whose
plan does not fit (check_fits), naming the worker and the amount.

Owns the model of cost only; imports rtpo.scenario.load/schema, rtpo.core's methods (to count), and reads
rtpo.llm's schema and tiny-model spec and rtpo.distributed's resources section (never builds either).

    from rtpo.plan import plan
    p = plan(load_scenario("scenarios/llm/qwen3-8b-8gpu.yaml"), hardware="A100-80GB")
    p.iteration()["generated_tokens"], p.fits, p.refusal(), p.to_dict()
"""

from __future__ import annotations

from rtpo.plan.estimate import Assumptions, DoesNotFit, PhasePlan, Plan, WorkerMemory, plan
from rtpo.plan.hardware import TABLE, Hardware
from rtpo.plan.render import render

__all__ = [
    "TABLE",
    "Assumptions",
    "DoesNotFit",
    "Hardware",
    "PhasePlan",
    "Plan",
    "WorkerMemory",
    "check_fits",
    "plan",
    "render",
]


def check_fits(cfg, hardware=None) -> Plan | None:
    """`rtpo run`'s check: raise DoesNotFit (a ConfigError) when cfg's workers exceed the hardware's
    memory (backend.hardware, else this machine).  A model whose shape cannot be known without loading
    it (no config.json, no known size in its name) is left to the build, which reports it: None."""
    from rtpo.scenario.schema import ConfigError

    try:
        p = plan(cfg, hardware)
    except DoesNotFit:
        raise
    except ConfigError as e:
        if "backend.model" in str(e):
            return None
        raise
    reason = p.refusal()
    if reason is not None:
        raise DoesNotFit(f"{reason} (rtpo plan shows every worker; backend.hardware names the accelerator)")
    return p
