"""Config sections shared by the llm backend's task kinds (math, QA with search, airline)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class SandboxSection(BaseModel):
    """`task.sandbox`: limits of one Python tool call (rtpo.llm.sandbox.SandboxLimits)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)
    wall_time_s: float = Field(10.0, gt=0, le=3600, description="wall-clock budget of one call")
    cpu_time_s: int = Field(5, ge=1, le=3600, description="CPU seconds of one call")
    memory_mb: int = Field(1024, ge=16, le=1 << 20, description="memory of one call, all its processes together")
    max_processes: int = Field(32, ge=1, le=4096, description="processes and threads of one call")
    allow_unisolated: bool = Field(
        False,
        description="where kernel isolation cannot be set up, run calls with resource limits only (logged "
        "loudly, metric tool/unisolated); false (default): such calls are refused",
    )

    def limits(self):
        from rtpo.llm.sandbox import SandboxLimits

        return SandboxLimits(
            wall_time_s=self.wall_time_s,
            cpu_time_s=self.cpu_time_s,
            memory_bytes=self.memory_mb * 1024 * 1024,
            max_processes=self.max_processes,
            allow_unisolated=self.allow_unisolated,
        )


class LoRASection(BaseModel):
    """`backend.lora`: train LoRA adapters (the `peft` library, extra `lora`) instead of every weight.

    The base weights stay frozen; checkpoints hold the adapters (and their optimiser state) alone; the
    KL reference is the base model with the adapters switched off; the engines get the merged weights
    W₀ + (α/r)·B·A after each phase, and `rtpo export` writes them merged (rtpo.llm.lora)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)
    enabled: bool = Field(False, description="train LoRA adapters on target_modules; the base weights stay frozen")
    rank: int = Field(8, ge=1, le=65536, description="r, the adapters' inner dimension")
    alpha: float = Field(16.0, gt=0, description="α: the adapters' update B·A is scaled by α/r")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input in training passes (0 = none)")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="linear layers that get adapters, by last name (Qwen3: q_proj k_proj v_proj o_proj "
        "gate_proj up_proj down_proj); a name the model lacks is refused before anything is built",
    )

    @field_validator("target_modules")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not name.isidentifier():
                raise ValueError(f"{name!r} is not a module name")
        if len(set(v)) != len(v):
            raise ValueError("names a module twice")
        return v

    def spec(self, init_seed: int = 0):
        """The learner's LoRASpec, or None when LoRA is off; init_seed seeds the adapters' initial A
        (the run's seed, the same on every learner rank)."""
        if not self.enabled:
            return None
        from rtpo.llm.lora import LoRASpec

        return LoRASpec(self.rank, self.alpha, self.dropout, tuple(self.target_modules), int(init_seed))


__all__ = ["LoRASection", "SandboxSection"]
