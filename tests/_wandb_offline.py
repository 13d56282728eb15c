"""Read a W&B offline run file (RUN/wandb/offline-run-*/run-<id>.wandb) back, for the tracker tests.

The file is W&B's transaction log: a 7-byte header (b":W&B", magic 0xBEE1, version 0), then records in
32 KiB blocks, each chunk framed as LevelDB's log format frames it (crc32 u32, length u16, type u8:
1 full, 2 first, 3 middle, 4 last; a block tail shorter than a frame header is zero padding).  Each
record is a `wandb.proto.wandb_internal_pb2.Record`, decoded with W&B's own protobuf classes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
FRAME = 7


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:FRAME])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), f"{path}: not a W&B transaction log"
    out, buf, pos = [], b"", FRAME
    while pos + FRAME <= len(data):
        left = BLOCK - pos % BLOCK
        if left < FRAME:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + FRAME])
        if kind == 0:
            break
        buf += data[pos + FRAME : pos + FRAME + length]
        pos += FRAME + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def segments(run_dir: Path) -> list[dict]:
    """Each offline segment of the run, oldest first: its run id, config and history {step: {key: value}}."""
    out = []
    for seg in sorted((Path(run_dir) / "wandb").glob("offline-run-*")):
        (log,) = seg.glob("run-*.wandb")
        info = {"dir": seg, "run_id": None, "config": {}, "history": {}}
        for rec in records(log):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                info["run_id"] = rec.run.run_id
                info["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
            elif kind == "config":
                info["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
            elif kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
                assert rec.history.step.num not in info["history"], "a step logged twice in one segment"
                info["history"][rec.history.step.num] = row
        info["config"].pop("_wandb", None)
        out.append(info)
    return out
