"""Config sections shared by the llm backend's task kinds (math, QA with search, airline)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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


__all__ = ["SandboxSection"]
