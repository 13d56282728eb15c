"""Accelerators the plan sizes a scenario against: a table of common ones and user entries from a file.

Figures are the vendors' datasheet values (dense, no sparsity): peak bf16 tensor FLOP/s, fp32 FLOP/s,
memory per device and its bandwidth, and the link weights cross between devices.  The efficiencies say
what share of the peak a well-written kernel reaches (a planning assumption, stated in every plan):
training matmuls at `train_efficiency` of peak FLOP/s (the issue's 40% MFU target), prefill at
`prefill_efficiency`, decoding at `decode_efficiency` of the memory bandwidth.

A user adds an accelerator with a YAML or JSON file holding one entry (the fields of `Hardware`) or a
mapping of names to entries, and passes its path where a name goes (`rtpo plan S --hardware my.yaml`,
`backend.hardware: my.yaml`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from rtpo.scenario.schema import ConfigError

GB = 1e9
GIB = 2**30


@dataclass(frozen=True)
class Hardware:
    """One device kind.

    name:               the table key (or the file's).
    kind:               "gpu" (each worker owns its devices) or "cpu" (every worker shares the host's memory).
    memory_gb:          memory of one device (GB = 1e9 bytes); a cpu entry: the host's RAM.
    bf16_tflops:        dense bf16 peak (tensor cores) of one device.
    fp32_tflops:        dense fp32 peak of one device (the compute dtype when mixed precision is off).
    mem_bw_gbs:         memory bandwidth of one device, GB/s.
    link_gbs:           device-to-device bandwidth a weight broadcast runs at, GB/s (NVLink in a node).
    devices_per_node:   devices one node holds (nodes = devices needed / this).
    runtime_overhead_gb: memory a process holds before any model (CUDA context, allocator slack, libraries).
    train_efficiency:   share of peak FLOP/s the learner's matmuls reach.
    prefill_efficiency: share of peak FLOP/s prompt processing reaches.
    decode_efficiency:  share of memory bandwidth a decode step reaches.
    step_overhead_s:    fixed time per decode step of an engine (scheduler, sampling, launch).
    turn_overhead_s:    fixed time per turn of a batch of episodes (tool calls, environment, tokenising).
    train_step_overhead_s: fixed time per learner micro-batch (host work, padding, launches).
    sync_overhead_s:    fixed time per weight sync (gather, engine reload bookkeeping).
    """

    name: str
    kind: str
    memory_gb: float
    bf16_tflops: float
    fp32_tflops: float
    mem_bw_gbs: float
    link_gbs: float
    devices_per_node: int = 8
    runtime_overhead_gb: float = 1.5
    train_efficiency: float = 0.4
    prefill_efficiency: float = 0.5
    decode_efficiency: float = 0.6
    step_overhead_s: float = 0.004
    turn_overhead_s: float = 0.05
    train_step_overhead_s: float = 0.01
    sync_overhead_s: float = 0.5

    def __post_init__(self) -> None:
        if self.kind not in ("gpu", "cpu"):
            raise ConfigError(f"hardware {self.name}: kind must be gpu or cpu, got {self.kind!r}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("name", "kind"):
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"hardware {self.name}: {f.name} must be a non-negative number, got {v!r}")
        for f in ("memory_gb", "bf16_tflops", "fp32_tflops", "mem_bw_gbs", "link_gbs", "devices_per_node"):
            if getattr(self, f) <= 0:
                raise ConfigError(f"hardware {self.name}: {f} must be > 0")
        for f in ("train_efficiency", "prefill_efficiency", "decode_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise ConfigError(f"hardware {self.name}: {f} must be in (0, 1]")

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * GB

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s of one device computing in `dtype` (bf16/fp16 on tensor cores, else fp32)."""
        return (self.bf16_tflops if dtype in ("bfloat16", "float16") else self.fp32_tflops) * 1e12

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gpu(name: str, memory_gb: float, bf16: float, fp32: float, bw: float, link: float) -> Hardware:
    return Hardware(name, "gpu", memory_gb, bf16, fp32, bw, link)


# Datasheet values (SXM parts unless named otherwise): H100 SXM 989 bf16 / 67 fp32 TFLOP/s, 3.35 TB/s,
# NVLink 900 GB/s; H200 the same compute, 141 GB at 4.8 TB/s; A100 312 / 19.5, 1.555 (40 GB) or
# 2.039 TB/s (80 GB), NVLink 600 GB/s; L40S 362 / 91.6, 864 GB/s, PCIe Gen4 x16 (~32 GB/s) between cards.
TABLE: dict[str, Hardware] = {
    h.name: h
    for h in (
        _gpu("H100-80GB", 80, 989, 67, 3350, 450),
        _gpu("H200", 141, 989, 67, 4800, 450),
        _gpu("A100-80GB", 80, 312, 19.5, 2039, 300),
        _gpu("A100-40GB", 40, 312, 19.5, 1555, 300),
        _gpu("L40S", 48, 362, 91.6, 864, 32),
        # this project's CI machines: 2 cores, 24 GiB shared by every process of a run.  The FLOP/s and
        # bandwidth are what one process reaches here (bench/bench_plan.py measures them: fp32 matmul at
        # 2 threads, a large copy); the overheads come from the same bench's engine and learner probes.
        Hardware(
            "cpu",
            "cpu",
            memory_gb=24 * GIB / GB,
            bf16_tflops=0.05,
            fp32_tflops=0.1,
            mem_bw_gbs=8,
            link_gbs=4,
            devices_per_node=1,
            runtime_overhead_gb=0.0,
            train_efficiency=0.5,
            prefill_efficiency=0.5,
            decode_efficiency=0.5,
            step_overhead_s=0.01,
            turn_overhead_s=0.05,
            train_step_overhead_s=0.05,
            sync_overhead_s=0.05,
        ),
    )
}
ALIASES = {"H100": "H100-80GB", "A100": "A100-80GB", "H200-141GB": "H200", "CPU": "cpu"}


def names() -> list[str]:
    return list(TABLE)


def _from_mapping(name: str, data: Any, where: str) -> Hardware:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: an accelerator entry must be a mapping of Hardware fields, got {data!r}")
    known = {f.name for f in fields(Hardware)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(known))})")
    entry = {"name": name, "kind": "gpu", **data}
    missing = [f for f in ("memory_gb", "bf16_tflops", "fp32_tflops", "mem_bw_gbs", "link_gbs") if f not in entry]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    return Hardware(**entry)


def load_file(path: str | os.PathLike) -> dict[str, Hardware]:
    """Accelerators from a YAML/JSON file: one entry (its `name` or the file's stem names it) or a
    mapping name -> entry."""
    from rtpo.scenario.schema import parse_yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"hardware file {p}: not found")
    data = parse_yaml(p.read_text(), f"hardware file {p}")
    if isinstance(data, dict) and "memory_gb" in data:
        name = str(data.get("name", p.stem))
        return {name: _from_mapping(name, {k: v for k, v in data.items() if k != "name"}, f"hardware file {p}")}
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"hardware file {p}: expected an entry or a mapping of names to entries")
    return {str(k): _from_mapping(str(k), v, f"hardware file {p}: {k}") for k, v in data.items()}


def get(name: str | os.PathLike | Hardware | None) -> Hardware:
    """A table name (case-insensitive), a path to a hardware file, or None: this machine (the CUDA device
    when torch sees one, else the `cpu` entry with this host's memory)."""
    if isinstance(name, Hardware):
        return name
    if name is None:
        return detect()
    s = str(name)
    if s.endswith((".yaml", ".yml", ".json")) or os.sep in s:
        entries = load_file(s)
        if len(entries) != 1:
            raise ConfigError(f"hardware file {s}: holds {len(entries)} entries; give one of {', '.join(entries)}")
        return next(iter(entries.values()))
    key = ALIASES.get(s, s)
    for k, h in TABLE.items():
        if k.lower() == key.lower():
            return h if h.kind != "cpu" else replace(h, memory_gb=host_memory_gb())
    raise ConfigError(f"hardware {s!r}: unknown (known: {', '.join(TABLE)}; or a YAML file with the fields)")


def host_memory_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / GB
    except OSError:
        pass
    return TABLE["cpu"].memory_gb


def detect() -> Hardware:
    """This machine: a CUDA device matched to the table by name (its real memory), else the cpu entry."""
    try:
        import torch

        if torch.cuda.is_available():
            dev = torch.cuda.get_device_properties(0)
            mem = dev.total_memory / GB
            for k, h in TABLE.items():
                if h.kind == "gpu" and k.split("-")[0] in dev.name and abs(h.memory_gb - mem) / h.memory_gb < 0.2:
                    return replace(h, memory_gb=mem)
            base = TABLE["H100-80GB"]
            return replace(base, name=dev.name, memory_gb=mem)
    except Exception:  # no torch or a broken driver: plan for the host
        pass
    return replace(TABLE["cpu"], memory_gb=host_memory_gb())
