"""The run folder's layout and the checkpoint format: the one module that knows file names.

A run folder holds `config.yaml` (the resolved scenario), `metrics.jsonl` (one line per phase), the
checkpoint history under `ckpt/` and, once a first checkpoint exists, `checkpoint.id` (the run's
fingerprint, written once and never changed).  `rtpo run`, `--resume`, `rtpo eval` and `rtpo export`
read and write through the functions here.

    ckpt/
        latest                  the name of the newest complete checkpoint folder (replaced atomically)
        iter_3/state.ckpt       the state after 3 completed iterations (kept: the last `logging.keep_last`)
        iter_3_phase_2/...      mid-iteration: iteration 4 with 2 of its phases done (only the newest is kept)
    hf/iter_3/                  llm runs with logging.hf_export_every: the policy as a Hugging Face folder

An llm run's learner writes its model and optimiser state itself, with torch.distributed.checkpoint (DCP):
every rank its own shard, no full gather, tied weights once, into `iter_3/learner-<k>/` (`.metadata`
plus one `__<rank>_0.distcp` per rank); state.ckpt beside it holds the rest (sampler, rng, budget,
progress) and the shard files' names, sizes and xxh3_128 digests (also in its header), and is written only
after every shard is on disk; every read (resume, eval, export) checks each shard against its digest, so a
flipped byte or a garbage shard or `.metadata` of the right size is a one-line refusal naming the file.  A
re-save of the same position writes a new `learner-<k+1>/` and drops the older one after state.ckpt
names the new one, so a kill at any point leaves state.ckpt naming complete shards.  Other learners
(tabular, the Ray trainer group) keep their state pickled inside state.ckpt.

A checkpoint folder is complete before `latest` names it, and older folders are pruned only after, so a
process killed at any point leaves `latest` naming a loadable checkpoint.  Runs written before the
history (a single `checkpoint.pkl` in the run folder) still resume and evaluate.

Checkpoint file format (version 2): one line `RTPO-CHECKPOINT 2\\n`, one line of JSON
`{"fingerprint", "sha256", "bytes"}`, then the pickled state.  The header lets a reader refuse a file
before unpickling anything: a foreign checkpoint (another run's fingerprint), a truncated or altered one
(length or digest differ) or a file that is no checkpoint at all is a one-line error, and nothing in the
run folder is touched.  Unpickling runs only on bytes whose digest the header vouches for — a checkpoint
is trusted data of this run, never input from elsewhere.

Resume never loses what exists: when `checkpoint.id` says a checkpoint was written but the one `latest`
names is gone, resuming is refused rather than silently restarting from phase 0 over the existing metrics.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtpo.scenario.schema import ConfigError, ScenarioConfig

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
CKPT_DIR = "ckpt"
LATEST = "latest"
STATE = "state.ckpt"
CHECKPOINT = "checkpoint.pkl"  # the single checkpoint of runs written before the history (read only)
CHECKPOINT_ID = "checkpoint.id"
LOCK = ".lock"  # held (flock) by the one process writing the run folder; see lock_run
SUMMARY = "summary.md"
SUMMARY_JSON = "summary.json"
CURVE = "learning_curve.png"
PROVENANCE = "provenance.json"  # git commit, package versions, command line of each process (rtpo.rundir.provenance)
GENERATIONS_DIR = "generations"  # RUN/generations/iter_N.jsonl: a few episodes of iteration N (llm runs)
HF_DIR = "hf"  # RUN/hf/iter_N: Hugging Face folders written during the run (logging.hf_export_every)
LEARNER_PREFIX = "learner-"  # ckpt/<name>/learner-<k>/: a learner's own sharded state (DCP)
DCP_FORMAT = "torch-dcp"
DCP_METADATA = ".metadata"
VERSION = 2
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)  # a write that failed for want of room
_MAGIC = b"RTPO-CHECKPOINT "
_STATE_KEYS = ("version", "learner", "sampler", "rng", "budget", "progress")
_NAME = re.compile(r"iter_(\d{1,9})(?:_phase_(\d{1,9}))?")


class RunLocked(ConfigError):
    """Another live process holds the run folder's lock (lock_run)."""


class RunLock:
    """An exclusive flock(2) on RUN/.lock, held for as long as a process writes the run folder.

    The kernel drops it when its holder exits, however it exits (SIGKILL included): a stale `.lock` file
    never blocks anyone, and only a live writer makes a second one be refused, at once (LOCK_NB), in one
    line naming the holder's pid, before it reads or touches anything."""

    def __init__(self, run_dir: Path) -> None:
        import fcntl

        self.path = Path(run_dir) / LOCK
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise ConfigError(f"{run_dir}: cannot open its lock file {LOCK} ({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = _flock_holder(fd)
            finally:
                os.close(fd)
            raise RunLocked(
                f"{run_dir}: another rtpo process ({holder}) is writing this run folder; "
                "wait for it to end (or stop it) and try again"
            ) from None
        self._fd: int | None = fd  # the file stays empty: taking the lock changes no byte of the folder

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _flock_holder(fd: int) -> str:
    """'pid N' of the process holding the flock on `fd`'s file, from /proc/locks (Linux); else 'pid unknown'."""
    st = os.fstat(fd)
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == want:
                    return f"pid {parts[4]}"
    except OSError:
        pass
    return "pid unknown"


def lock_run(run_dir: Path) -> RunLock:
    """Take RUN/.lock for this process (RunLocked, one line, when a live process holds it)."""
    return RunLock(run_dir)


def fingerprint(cfg: ScenarioConfig) -> str:
    """Identity of a run: the hash of its resolved scenario minus the sections a resume may change
    (`budget`: extending a finished run; `logging`: how it reports).  Two runs with the same shapes but
    another seed, task, method or setting have different fingerprints."""
    data = {k: v for k, v in cfg.to_dict().items() if k not in ("budget", "logging")}
    blob = json.dumps({"format": VERSION, "config": data}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a folder; the rename is still atomic
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `path` so that a crash leaves either the old file or the new one, never a torn one."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:  # disk full: drop the partial file (it holds space) and name the file meant
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from None
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def checkpoint_name(iteration: int, phase_in_iter: int | None = None) -> str:
    """`iter_N` after N completed iterations; `iter_N_phase_P` inside iteration N+1 with P phases done."""
    return f"iter_{iteration}" + (f"_phase_{phase_in_iter}" if phase_in_iter is not None else "")


def _position(name: str) -> tuple[int, int] | None:
    """Sort key of a checkpoint name: (N, 0) for iter_N, (N, P + 1) for iter_N_phase_P; None otherwise."""
    m = _NAME.fullmatch(name)
    if not m:
        return None
    return (int(m.group(1)), 0 if m.group(2) is None else int(m.group(2)) + 1)


@dataclass(frozen=True)
class ShardedLearner:
    """state["learner"] for write_checkpoint from a learner that writes its own shards:
    save(folder) -> {"dir": the folder holding them, "steps", "tied", "world_size", "config"}
    (rtpo.llm.learner.FSDPLearner.save_sharded)."""

    save: Callable[[Path], dict]


def is_sharded(learner: Any) -> bool:
    """Whether a checkpoint's learner state is a sharded (DCP) one rather than pickled tensors."""
    return isinstance(learner, dict) and learner.get("format") == DCP_FORMAT


def _learner_dirs(folder: Path) -> list[Path]:
    return sorted(
        (p for p in folder.glob(LEARNER_PREFIX + "*") if p.name[len(LEARNER_PREFIX) :].isdigit()),
        key=lambda p: int(p.name[len(LEARNER_PREFIX) :]),
    )


def _fresh_learner_dir(folder: Path) -> Path:
    have = _learner_dirs(folder)
    return folder / f"{LEARNER_PREFIX}{int(have[-1].name[len(LEARNER_PREFIX) :]) + 1 if have else 1}"


DIGEST = "xxh3_128"  # of every shard file: ~10x sha256's speed here, so a checkpoint write stays within 1.1x


def _digest_path(path: Path) -> str:
    """The file's xxh3_128, hashed straight from the page cache through a memory map (no copy)."""
    import mmap

    import xxhash

    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return xxhash.xxh3_128(b"").hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return xxhash.xxh3_128(m).hexdigest()


def _fsync_files(folder: Path) -> tuple[dict[str, int], dict[str, str]]:
    """fsync every file of `folder` and the folder; returns ({name: bytes}, {name: digest}).  The digests
    are read back right after the write (from the page cache), each in a thread while the file's fsync
    waits for the disk, so they cost little beside the write (bench/checkpoint_digest.json)."""
    from concurrent.futures import ThreadPoolExecutor

    paths = [p for p in sorted(folder.iterdir()) if p.is_file()]
    with ThreadPoolExecutor(max_workers=2) as pool:
        digests = {p.name: pool.submit(_digest_path, p) for p in paths}
        files = {}
        for p in paths:
            with open(p, "rb") as f:
                os.fsync(f.fileno())
            files[p.name] = p.stat().st_size
        _fsync_dir(folder)
        return files, {name: fut.result() for name, fut in digests.items()}


def _sharded_entry(folder: Path, info: dict) -> dict:
    where = Path(info["dir"])
    if where.parent.resolve() != folder.resolve() or not (where / DCP_METADATA).is_file():
        raise RuntimeError(f"the learner wrote no complete sharded state into {folder} (got {where})")
    return {
        "format": DCP_FORMAT,
        "dir": where.name,
        **dict(zip(("files", DIGEST), _fsync_files(where), strict=True)),
        **{k: info[k] for k in ("steps", "tied", "world_size", "config")},
    }


def _copy_sharded(folder: Path, learner: dict) -> dict:
    """The sharded state read from another checkpoint folder (a --resume --iter fork), linked or copied
    into `folder`."""
    src, dst = Path(learner["path"]), _fresh_learner_dir(folder)
    dst.mkdir()
    for name in learner["files"]:
        try:
            os.link(src / name, dst / name)  # the shards are never rewritten in place: sharing is safe
        except OSError:
            shutil.copy2(src / name, dst / name)
    entry = {k: v for k, v in learner.items() if k != "path"}
    entry["dir"] = dst.name
    entry["files"], entry[DIGEST] = _fsync_files(dst)
    return entry


def _encode(cfg: ScenarioConfig, state: dict[str, Any]) -> bytes:
    payload = pickle.dumps({"version": VERSION, **state}, protocol=pickle.HIGHEST_PROTOCOL)
    header = {"fingerprint": fingerprint(cfg), "sha256": hashlib.sha256(payload).hexdigest(), "bytes": len(payload)}
    learner = state.get("learner")
    if is_sharded(learner):
        header["learner"] = learner["dir"]  # readable without unpickling (discard_uncommitted)
        header["learner_" + DIGEST] = learner.get(DIGEST, {})  # for people; the verified copy is in the state
    return _MAGIC + f"{VERSION}\n".encode() + json.dumps(header).encode() + b"\n" + payload


def _header(path: Path) -> dict | None:
    try:
        with open(path, "rb") as f:
            if f.read(len(_MAGIC)) != _MAGIC:
                return None
            f.readline(16)
            return json.loads(f.readline(4096).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _drop_learner_dirs(folder: Path, keep: str | None) -> None:
    for p in _learner_dirs(folder):
        if p.name != keep:
            shutil.rmtree(p, ignore_errors=True)


def no_room(e: BaseException, where: Path) -> OSError | None:
    """The write failure `e` as one OSError naming its file (`where` when it names none) when it was for want
    of room (disk full, quota, file too large, read-only: NO_ROOM), else None.

    torch.distributed.checkpoint reports a full disk as a CheckpointException holding each rank's failure,
    often PyTorchStreamWriter's "unexpected pos" RuntimeError with the OSError only in its context, and a
    failure sent from another rank loses its context in pickling; so the exception's cause and context
    chains and the ranks' failures are searched for the OSError, and a failure with none found while the
    filesystem holding `where` has less than a mebibyte free is taken as ENOSPC."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno in NO_ROOM:
            return OSError(x.errno, x.strerror, x.filename or str(where))
        todo += [x.__cause__, x.__context__]
        failures = getattr(x, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        return None
    try:
        free = shutil.disk_usage(next(p for p in (where, *where.parents) if p.exists())).free
    except (OSError, StopIteration):
        return None
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where)) if free < 2**20 else None


def write_checkpoint(
    run_dir: Path, cfg: ScenarioConfig, state: dict[str, Any], name: str, keep_last: int | None = None
) -> Path:
    """Write `state` (a dict with the keys of _STATE_KEYS) as checkpoint `name` of the run, make it the
    latest, then prune: every older mid-iteration checkpoint, and iteration checkpoints beyond the newest
    `keep_last` (None: keep all).  Order matters: complete folder, then pointer, then pruning — a kill at
    any step leaves `latest` naming a complete checkpoint.  Returns the folder."""
    if _position(name) is None:
        raise ValueError(f"checkpoint name {name!r} is not iter_N or iter_N_phase_P")
    run_dir = Path(run_dir)
    root = run_dir / CKPT_DIR
    folder = root / name
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    state = dict(state)
    learner = state.get("learner")
    if isinstance(learner, ShardedLearner):  # every rank writes its shard into a folder nothing names yet
        shards = _fresh_learner_dir(folder)
        try:
            saved = learner.save(shards)
        except BaseException as e:  # torch.distributed.checkpoint's CheckpointException is a BaseException
            full = no_room(e, shards)
            if full is None:
                raise
            # the torn shards (and the folder this call made): `latest` still names the last checkpoint
            shutil.rmtree(folder if created else shards, ignore_errors=True)
            raise full from None
        state["learner"] = _sharded_entry(folder, saved)
    elif is_sharded(learner) and "path" in learner:  # a verified state of another folder (a fork)
        state["learner"] = _copy_sharded(folder, learner)
    atomic_write_bytes(folder / STATE, _encode(cfg, state))  # re-saving a position replaces the file atomically
    _drop_learner_dirs(folder, state["learner"]["dir"] if is_sharded(state["learner"]) else None)
    _fsync_dir(root)
    atomic_write_text(root / LATEST, name + "\n")
    if not (run_dir / CHECKPOINT_ID).exists():
        atomic_write_text(run_dir / CHECKPOINT_ID, fingerprint(cfg) + "\n")
    _prune(root, name, keep_last)
    return folder


def _prune(root: Path, latest: str, keep_last: int | None) -> None:
    names = sorted((p.name for p in root.iterdir() if p.is_dir() and _position(p.name)), key=_position)
    whole = [n for n in names if _position(n)[1] == 0 and n != latest]
    drop = [n for n in names if _position(n)[1] != 0 and n != latest]
    if keep_last is not None:
        keep = keep_last - (1 if _position(latest)[1] == 0 else 0)
        drop += whole[: max(len(whole) - keep, 0)]
    for n in drop:
        shutil.rmtree(root / n, ignore_errors=True)


def discard_uncommitted(run_dir: Path) -> None:
    """Before a resumed run writes: remove checkpoint folders newer than `latest` (written by a process
    killed before it moved the pointer) and stray temporary files, so that pruning counts only history."""
    root = Path(run_dir) / CKPT_DIR
    name = latest_name(run_dir)
    if name is None or not root.is_dir():
        return
    here = _position(name)
    for p in root.iterdir():
        pos = _position(p.name)
        if p.is_dir() and pos is not None and pos > here:
            shutil.rmtree(p, ignore_errors=True)
        elif p.is_dir() and pos is not None:
            (p / (STATE + ".tmp")).unlink(missing_ok=True)
            header = _header(p / STATE)
            if header is not None:  # shards of a re-save killed before its state.ckpt named them
                _drop_learner_dirs(p, header.get("learner"))
    (root / (LATEST + ".tmp")).unlink(missing_ok=True)
    hf = Path(run_dir) / HF_DIR
    for p in hf.glob(".*.tmp-*") if hf.is_dir() else ():  # an export killed before its rename
        shutil.rmtree(p, ignore_errors=True)


def latest_name(run_dir: Path) -> str | None:
    """The checkpoint `ckpt/latest` names, None when there is no pointer; a corrupt pointer is an error."""
    path = Path(run_dir) / CKPT_DIR / LATEST
    try:
        text = path.read_text(encoding="ascii", errors="strict").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        raise ConfigError(f"{path}: unreadable checkpoint pointer") from None
    if _position(text) is None:
        raise ConfigError(f"{path}: corrupt checkpoint pointer (names no iter_N checkpoint)")
    return text


def latest_path(run_dir: Path) -> Path | None:
    """The file of the run's latest checkpoint (`ckpt/<latest>/state.ckpt`, or a pre-history run's
    `checkpoint.pkl`), None when the run has none.  The file may be missing: resume_state refuses then."""
    run_dir = Path(run_dir)
    name = latest_name(run_dir)
    if name is not None:
        return run_dir / CKPT_DIR / name / STATE
    return run_dir / CHECKPOINT if (run_dir / CHECKPOINT).is_file() else None


def hf_export_path(run_dir: Path, iteration: int) -> Path:
    """RUN/hf/iter_N: the Hugging Face folder of the policy after N iterations (logging.hf_export_every)."""
    return Path(run_dir) / HF_DIR / checkpoint_name(iteration)


def generations_path(run_dir: Path, iteration: int) -> Path:
    """RUN/generations/iter_N.jsonl: the first few episodes sampled in iteration N (0-based, as metrics'
    `iteration`), one JSON object a line (logging.generations_per_iteration)."""
    return Path(run_dir) / GENERATIONS_DIR / f"iter_{iteration}.jsonl"


def has_checkpoint(run_dir: Path) -> bool:
    path = latest_path(run_dir)
    return path is not None and path.is_file()


def iterations_saved(run_dir: Path) -> list[int]:
    """The N of every complete `ckpt/iter_N` (iteration-boundary) checkpoint, ascending."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        pos = _position(p.name)
        if pos is not None and pos[1] == 0 and (p / STATE).is_file():
            out.append(pos[0])
    return sorted(out)


def iteration_path(run_dir: Path, iteration: int) -> Path:
    """The file of checkpoint `ckpt/iter_N` (the state after N iterations); a one-line error naming the
    iterations that are there when it is not."""
    path = Path(run_dir) / CKPT_DIR / checkpoint_name(iteration) / STATE
    if iteration < 0 or not path.is_file():
        have = iterations_saved(run_dir)
        listed = ", ".join(map(str, have)) if have else "none"
        raise ConfigError(
            f"--iter {iteration}: {run_dir} has no checkpoint after iteration {iteration} "
            f"(saved iterations: {listed}; logging.keep_last and logging.checkpoint_every decide which are kept)"
        )
    return path


def read_checkpoint(path: Path, cfg: ScenarioConfig | None = None) -> dict[str, Any]:
    """The state stored in checkpoint file `path`, verified before it is unpickled: a one-line
    ConfigError for anything that is not an intact checkpoint of version VERSION (and, given `cfg`, of
    that run).  Reads only; touches nothing."""
    where = str(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_MAGIC))
            if magic != _MAGIC:
                raise ConfigError(f"{where}: not an rtpo checkpoint (or one written before format {VERSION})")
            version_line = f.readline(16)
            header_line = f.readline(4096)
            payload = f.read()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read the checkpoint ({e.strerror or e})") from None
    try:
        version = int(version_line.decode("ascii").strip())
        header = json.loads(header_line.decode("utf-8"))
        expected_fp, digest, size = str(header["fingerprint"]), str(header["sha256"]), int(header["bytes"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ConfigError(f"{where}: corrupt checkpoint header") from None
    if version != VERSION:
        raise ConfigError(f"{where}: checkpoint format {version} is not {VERSION}")
    if len(payload) != size:
        raise ConfigError(
            f"{where}: truncated or altered checkpoint ({len(payload)} bytes of state, header says {size})"
        )
    if hashlib.sha256(payload).hexdigest() != digest:
        raise ConfigError(f"{where}: corrupt checkpoint (its state does not match the digest in its header)")
    if cfg is not None and expected_fp != fingerprint(cfg):
        raise ConfigError(
            f"{where}: the checkpoint belongs to another run (fingerprint {expected_fp[:12]}, "
            f"this run's config gives {fingerprint(cfg)[:12]})"
        )
    try:
        state = pickle.loads(payload)
    except Exception as e:  # noqa: BLE001 - the digest matched, so this is a bug or a foreign rtpo version
        raise ConfigError(f"{where}: unreadable checkpoint state ({type(e).__name__})") from None
    if not isinstance(state, dict) or any(k not in state for k in _STATE_KEYS) or state["version"] != VERSION:
        raise ConfigError(f"{where}: checkpoint state is incomplete")
    learner = state["learner"]
    if is_sharded(learner):
        shards = Path(path).parent / str(learner["dir"])
        digests = learner.get(DIGEST) or {}  # checkpoints written before the digests have sizes only
        for name, size in learner["files"].items():
            got = (shards / name).stat().st_size if (shards / name).is_file() else None
            if got != size:
                raise ConfigError(
                    f"{where}: its sharded learner state {learner['dir']}/{name} is "
                    + ("missing" if got is None else f"{got} bytes, the checkpoint says {size}")
                )
            if name in digests:
                try:
                    ok = _digest_path(shards / name) == digests[name]
                except OSError as e:
                    raise ConfigError(f"{shards / name}: cannot read the shard ({e.strerror or e})") from None
                if not ok:
                    raise ConfigError(
                        f"{shards / name}: corrupt sharded learner state (its content does not match the "
                        f"{DIGEST} digest the checkpoint {where} recorded)"
                    )
        state["learner"] = {**learner, "path": str(shards)}
    return state


def resume_state(run_dir: Path, cfg: ScenarioConfig, iteration: int | None = None) -> dict[str, Any] | None:
    """The latest checkpoint of run `run_dir` (or, given `iteration`, `ckpt/iter_<iteration>`), or None
    when the run never wrote one.  Refuses (one line) a checkpoint of another run, a corrupt one, and a
    checkpoint that was written but is gone."""
    run_dir = Path(run_dir)
    if iteration is not None:
        state = read_checkpoint(iteration_path(run_dir, iteration), cfg)
        check_id(run_dir, cfg)
        return state
    path = latest_path(run_dir)
    if path is not None and path.is_file():
        state = read_checkpoint(path, cfg)
        check_id(run_dir, cfg)
        return state
    if path is not None or (run_dir / CHECKPOINT_ID).exists():
        missing = path.relative_to(run_dir) if path is not None else f"{CKPT_DIR}/{LATEST}"
        raise ConfigError(
            f"--resume {run_dir}: the checkpoint {missing} is missing but the run wrote one ({CHECKPOINT_ID}); "
            f"refusing to restart from phase 0 over its {METRICS} (move the folder aside to start anew)"
        )
    return None


def check_id(run_dir: Path, cfg: ScenarioConfig) -> None:
    """Refuse (one line) a run folder whose checkpoint.id names another run than `cfg`."""
    try:
        recorded = (run_dir / CHECKPOINT_ID).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return  # a crash right after the first checkpoint can leave no id yet; the checkpoint itself matched
    if recorded != fingerprint(cfg):
        raise ConfigError(f"--resume {run_dir}: {CHECKPOINT_ID} names another run ({recorded[:12]})")


def model_weights(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """The policy's full model state dict (HF names) held by checkpoint `path` whose verified state is
    `state` (read_checkpoint): what `rtpo export` writes.  A one-line error when it holds none."""
    learner = state.get("learner")
    if is_sharded(learner):
        return _sharded_model_weights(learner)
    if isinstance(learner, dict) and isinstance(learner.get("model"), dict) and learner["model"]:
        return learner["model"]
    raise ConfigError(f"{path}: the checkpoint holds no model weights (its learner state has no 'model')")


def _sharded_model_weights(learner: dict) -> dict[str, Any]:
    """Full model tensors from a verified sharded learner state, in this process alone (no process
    group): DCP reassembles every rank's shards; the tied keys left out get their kept key's tensor."""
    import torch
    import torch.distributed.checkpoint as dcp

    try:  # a checkpoint from before the digests may still hold a damaged shard: one line, not a traceback
        meta = dcp.FileSystemReader(learner["path"]).read_metadata()
        weights = {
            fqn.removeprefix("model."): torch.empty(tuple(m.size), dtype=m.properties.dtype)
            for fqn, m in meta.state_dict_metadata.items()
            if fqn.startswith("model.") and hasattr(m, "size") and hasattr(m, "properties")
        }
        dcp.load({"model": weights}, checkpoint_id=learner["path"], no_dist=True)
    except Exception as e:  # noqa: BLE001 - whatever DCP raises on damaged files
        raise ConfigError(f"{learner['path']}: unreadable sharded learner state ({type(e).__name__})") from None
    for key, kept in learner["tied"].items():
        weights[key] = weights[kept]
    return weights


def read_metrics(run_dir: Path, limit: int | None = None) -> list[dict]:
    """The complete lines of metrics.jsonl (at most `limit`); a torn last line is ignored."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").split("\n"):
        if limit is not None and len(out) >= limit:
            break
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def truncate_metrics(run_dir: Path, lines: int) -> None:
    """Keep exactly the first `lines` metric lines: the phases the checkpoint covers."""
    kept = read_metrics(run_dir, lines)
    if len(kept) < lines:
        raise ConfigError(f"--resume {run_dir}: {METRICS} has {len(kept)} lines, the checkpoint expects {lines}")
    atomic_write_text(Path(run_dir) / METRICS, "".join(json.dumps(m) + "\n" for m in kept))
