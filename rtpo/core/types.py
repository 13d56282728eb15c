"""Typed data that crosses module boundaries: ragged arrays, turns, trajectories, boundaries, batches.

Notation follows SPEC §1 / the paper's §3: an episode is a prompt q followed by turns k = 0..K-1; at
boundary k the model sees the context c_k = ψ(S_k) and emits a response (macro-action u_k) realised as
tokens a_{k,1..T_k}; the environment answers with feedback f_k and a reward r_k and the turn consumes
τ_k discount steps.  Everything here is a frozen dataclass of numpy arrays whose invariants are checked
on construction; nothing hands out a mutable view of its internals.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.flags.writeable:
        a = a.copy()
        a.flags.writeable = False
    return a


@dataclass(frozen=True)
class Ragged:
    """A batch of variable-length 1-D rows stored flat.

    values:  (N,) the rows concatenated.
    offsets: (B+1,) int64, offsets[0] == 0, non-decreasing, offsets[-1] == N; row i is
             values[offsets[i]:offsets[i+1]].
    """

    values: np.ndarray
    offsets: np.ndarray

    def __post_init__(self) -> None:
        values = _frozen(self.values)
        offsets = _frozen(np.asarray(self.offsets, dtype=np.int64))
        if values.ndim != 1:
            raise ValueError(f"Ragged.values must be 1-D, got shape {values.shape}")
        if offsets.ndim != 1 or offsets.size == 0 or offsets[0] != 0:
            raise ValueError("Ragged.offsets must be 1-D and start at 0")
        if offsets[-1] != values.size or np.any(np.diff(offsets) < 0):
            raise ValueError("Ragged.offsets must be non-decreasing and end at len(values)")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "offsets", offsets)

    @classmethod
    def _unchecked(cls, values: np.ndarray, offsets: np.ndarray) -> Ragged:
        """A Ragged from read-only arrays already known to satisfy the invariants (e.g. a contiguous
        slice of a checked Ragged).  Skips __post_init__, whose checks dominated per-episode assembly
        in the rollout driver."""
        obj = object.__new__(cls)
        object.__setattr__(obj, "values", values)
        object.__setattr__(obj, "offsets", offsets)
        return obj

    @staticmethod
    def from_rows(rows: Sequence[np.ndarray], dtype: Any = None) -> Ragged:
        rows = [np.asarray(r).reshape(-1) for r in rows]
        lengths = np.fromiter((r.size for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if rows:
            values = np.concatenate(rows)
        else:
            values = np.zeros(0)
        if dtype is not None:
            values = values.astype(dtype, copy=False)
        return Ragged(values, offsets)

    @staticmethod
    def _owned(values: np.ndarray, offsets: np.ndarray) -> Ragged:
        """A Ragged from arrays this module just built to satisfy the invariants (nobody else holds
        them): frozen in place, the checks skipped."""
        values.flags.writeable = False
        offsets.flags.writeable = False
        return Ragged._unchecked(values, offsets)

    @staticmethod
    def from_dense(rows: np.ndarray) -> Ragged:
        """Equal-length rows (B, L) -> Ragged without a Python loop."""
        rows = np.asarray(rows)
        b, length = rows.shape
        return Ragged._owned(rows.reshape(-1).copy(), np.arange(b + 1, dtype=np.int64) * length)._with_width(length)

    def _with_width(self, width: int) -> Ragged:
        """Records that every row has `width` values (known from how the arrays were built), so that
        take, is_uniform and concat need not recompute the row lengths."""
        object.__setattr__(self, "_width", int(width))
        return self

    def _uniform_width(self) -> int | None:
        """The common row length, or None when rows differ (computed once, then remembered)."""
        w = self.__dict__.get("_width")
        if w is None:
            lengths = np.diff(self.offsets)
            w = int(lengths[0]) if lengths.size and np.all(lengths == lengths[0]) else -1
            object.__setattr__(self, "_width", w)
        return None if w < 0 else w

    def __len__(self) -> int:
        return self.offsets.size - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self[i]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def rows(self, lo: int, hi: int) -> Ragged:
        """Rows lo..hi-1, contiguous: a read-only view (a slice, not a gather)."""
        off = self.offsets[lo : hi + 1]
        rebased = off - off[0]
        rebased.flags.writeable = False
        return Ragged._unchecked(self.values[off[0] : off[-1]], rebased)

    def equals(self, other: Ragged) -> bool:
        """Same rows with the same values."""
        return bool(np.array_equal(self.offsets, other.offsets) and np.array_equal(self.values, other.values))

    def take(self, idx: np.ndarray) -> Ragged:
        """Rows idx (any order, repeats allowed), vectorised."""
        idx = np.asarray(idx, dtype=np.int64)
        width = self._uniform_width()
        if width and len(self):  # equal non-empty rows: a gather of (rows, width) blocks
            values = np.take(self.values.reshape(-1, width), idx, axis=0).reshape(-1)  # a block copy of rows
            return Ragged._owned(values, np.arange(idx.size + 1, dtype=np.int64) * width)._with_width(width)
        lengths = self.lengths[idx]
        offsets = np.zeros(idx.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        starts = self.offsets[idx]
        if lengths.size and np.all(lengths == lengths[0]):  # equal rows: a 2-D gather
            width = int(lengths[0])
            src = (starts[:, None] + np.arange(width)).reshape(-1)
        else:  # position of every output element inside self.values
            src = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        return Ragged._owned(self.values[src], offsets)

    def is_uniform(self, length: int) -> bool:
        return len(self) == 0 or self._uniform_width() == length

    def to_dense(self, pad: float | int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(B, L_max) padded values and (B, L_max) bool mask."""
        lengths = self.lengths
        width = int(lengths.max()) if lengths.size else 0
        out = np.full((len(self), width), pad, dtype=self.values.dtype)
        mask = np.arange(width)[None, :] < lengths[:, None]
        out[mask] = self.values
        return out, mask

    @staticmethod
    def concat(parts: Sequence[Ragged]) -> Ragged:
        parts = list(parts)
        if not parts:
            return Ragged(np.zeros(0), np.zeros(1, dtype=np.int64))
        values = np.concatenate([p.values for p in parts])
        offs = [parts[0].offsets]
        base = parts[0].offsets[-1]
        for p in parts[1:]:
            offs.append(p.offsets[1:] + base)
            base += p.offsets[-1]
        out = Ragged._owned(values, np.concatenate(offs))  # valid parts concatenate to a valid Ragged
        widths = {p.__dict__.get("_width") for p in parts if len(p)}
        if len(widths) == 1 and None not in widths and -1 not in widths:
            out._with_width(widths.pop())
        return out


@dataclass(frozen=True)
class Generation:
    """What a Sampler returns for a batch of B contexts: one response per row.

    tokens: Ragged of int64 token ids (for the tabular backend one token: the action index).
    logp:   Ragged of float64, the sampler's log-probability of each token, same offsets as tokens.
    """

    tokens: Ragged
    logp: Ragged

    def __post_init__(self) -> None:
        if not np.array_equal(self.tokens.offsets, self.logp.offsets):
            raise ValueError("Generation.tokens and .logp must have identical offsets")

    def __len__(self) -> int:
        return len(self.tokens)

    def take(self, idx: np.ndarray) -> Generation:
        return Generation(self.tokens.take(idx), self.logp.take(idx))


@dataclass(frozen=True)
class StepOutcome:
    """The environment's answer to one turn of B episodes.

    reward:   (B,) r_k.
    duration: (B,) τ_k, discount steps consumed by the turn (Eq. 19: τ_k = T_k tokens).
    done:     (B,) bool, the episode ended with this turn (an answer, or the last turn K-1).
    feedback: length-B list of f_k (text, token ids, or None); opaque to the core.
    malformed: (B,) bool, the response could not be parsed (feedback, never a crash).
    """

    reward: np.ndarray
    duration: np.ndarray
    done: np.ndarray
    feedback: list
    malformed: np.ndarray

    def __post_init__(self) -> None:
        b = np.asarray(self.reward).shape[0]
        for name in ("duration", "done", "malformed"):
            if np.asarray(getattr(self, name)).shape != (b,):
                raise ValueError(f"StepOutcome.{name} must have shape ({b},)")
        if len(self.feedback) != b:
            raise ValueError(f"StepOutcome.feedback must have {b} entries")


@dataclass(frozen=True)
class Trajectory:
    """One episode (or the tail of one, for a sibling started at boundary `start_turn`).

    contexts:  Ragged, row j is c_{k0+j} exactly as the model saw it at rollout (token ids).
    tokens:    Ragged, row j is the response of turn k0+j.
    logp:      Ragged, the rollout (old) log-probs of those tokens.
    rewards:   (n,) r_{k0+j}.
    durations: (n,) τ_{k0+j}.
    malformed: (n,) bool.
    query_id:  the query (prompt) index.
    start_turn: k0; 0 for a trunk, k for a sibling forked at boundary k.
    gamma:     per-token-step discount.
    full_contexts: optional Ragged, row j is the full-history context of turn k0+j (recorded only when
               the environment exposes `full_contexts`; flat baselines train on it to reproduce the
               rollout/training context mismatch of Eq. 2/10).  None otherwise.
    """

    contexts: Ragged
    tokens: Ragged
    logp: Ragged
    rewards: np.ndarray
    durations: np.ndarray
    malformed: np.ndarray
    query_id: int
    start_turn: int
    gamma: float = 1.0
    full_contexts: Ragged | None = None

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.contexts) != n or len(self.logp) != n:
            raise ValueError("Trajectory contexts/tokens/logp must have one row per turn")
        if self.full_contexts is not None and len(self.full_contexts) != n:
            raise ValueError("Trajectory.full_contexts must have one row per turn")
        for name in ("rewards", "durations", "malformed"):
            arr = _frozen(np.asarray(getattr(self, name)))
            if arr.shape != (n,):
                raise ValueError(f"Trajectory.{name} must have shape ({n},), got {arr.shape}")
            object.__setattr__(self, name, arr)
        if n == 0:
            raise ValueError("a Trajectory has at least one turn")

    @property
    def num_turns(self) -> int:
        return len(self.tokens)

    @property
    def end_turn(self) -> int:
        """Index of the last turn taken (inclusive)."""
        return self.start_turn + self.num_turns - 1

    @property
    def ret(self) -> float:
        """R = Σ_j γ^{Σ_{m<j} τ_m} r_j from start_turn on (SPEC §1, Eq. 19)."""
        return discounted_return(self.rewards, self.durations, self.gamma)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.values.size)


def discounted_return(rewards: np.ndarray, durations: np.ndarray, gamma: float) -> float:
    """R = Σ_j γ^{Σ_{m<j} τ_m} r_j (SPEC §1; the turn-level discount of Eq. 19-20)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    if gamma == 1.0:
        return float(rewards.sum())
    elapsed = np.concatenate([[0.0], np.cumsum(durations, dtype=np.float64)[:-1]])
    return float(np.sum(rewards * gamma**elapsed))


def segment_returns(
    reward: np.ndarray, duration: np.ndarray, start: np.ndarray, count: np.ndarray, gamma: float
) -> np.ndarray:
    """R = Σ_j γ^{Σ_{m<j} τ_m} r_j of each segment of rows start[i] .. start[i]+count[i]−1 (SPEC §1,
    Eq. 19-20), vectorised over segments.

    Bit-identical to discounted_return on each segment: segments of equal length L are summed as one
    (m, L) block, whose row sums numpy reduces exactly as it reduces one length-L array, and elapsed
    durations are integers, so differences of their running sums are exact."""
    reward = np.asarray(reward, dtype=np.float64)
    start = np.asarray(start, dtype=np.int64)
    count = np.asarray(count, dtype=np.int64)
    first = np.cumsum(count) - count  # where each segment starts in the gathered layout
    rows = np.repeat(start - first, count) + np.arange(int(count.sum()))
    v = reward[rows]
    if gamma != 1.0:
        before = np.cumsum(duration, dtype=np.float64) - np.asarray(duration, np.float64)
        elapsed = before[rows] - np.repeat(before[start], count)
        v = v * gamma**elapsed
    out = np.zeros(start.size)
    for length in np.unique(count):
        sel = np.flatnonzero(count == length)
        out[sel] = v[first[sel, None] + np.arange(length)].sum(axis=1)
    return out


class Rollouts(Sequence):
    """The episodes of one rollout call as columns: one row per generated turn, never one Python object
    per episode.  It is a Sequence[Trajectory]: indexing builds that episode's Trajectory on demand, so
    code written for per-episode trajectories reads it unchanged.

    Rows (N): turn, contexts, tokens, logp (Ragged, N rows each), reward, duration, malformed,
              optionally full_contexts (Ragged) and snapshots (one per row: the snapshot of the boundary
              before that turn, an (N, ...) array or a length-N list).
    Episodes (E): episode e is the rows row_start[e] .. row_start[e] + num_rows[e] − 1 (in turn order),
              query_id[e], start_turn[e].  `select` re-indexes episodes without copying any row.
    """

    __slots__ = (
        "turn",
        "contexts",
        "tokens",
        "logp",
        "reward",
        "duration",
        "malformed",
        "full_contexts",
        "snapshots",
        "row_start",
        "num_rows",
        "query_id",
        "start_turn",
        "gamma",
    )

    def __init__(
        self,
        *,
        turn: np.ndarray,
        contexts: Ragged,
        tokens: Ragged,
        logp: Ragged,
        reward: np.ndarray,
        duration: np.ndarray,
        malformed: np.ndarray,
        row_start: np.ndarray,
        num_rows: np.ndarray,
        query_id: np.ndarray,
        start_turn: np.ndarray,
        gamma: float,
        full_contexts: Ragged | None = None,
        snapshots: Any = None,
    ) -> None:
        n = len(tokens)
        set_ = object.__setattr__
        for name, arr, dtype in (
            ("turn", turn, np.int64),
            ("reward", reward, np.float64),
            ("duration", duration, np.float64),
            ("malformed", malformed, bool),
        ):
            a = _frozen(np.asarray(arr, dtype=dtype))
            if a.shape != (n,):
                raise ValueError(f"Rollouts.{name} must have shape ({n},), got {a.shape}")
            set_(self, name, a)
        for name, r in (("contexts", contexts), ("logp", logp), ("full_contexts", full_contexts)):
            if r is not None and len(r) != n:
                raise ValueError(f"Rollouts.{name} must have one row per turn ({n})")
        if not np.array_equal(logp.offsets, tokens.offsets):
            raise ValueError("Rollouts.logp must align token-for-token with tokens")
        if snapshots is not None and len(snapshots) != n:
            raise ValueError(f"Rollouts.snapshots must have one entry per turn ({n})")
        set_(self, "contexts", contexts)
        set_(self, "tokens", tokens)
        set_(self, "logp", logp)
        set_(self, "full_contexts", full_contexts)
        set_(self, "snapshots", _frozen(snapshots) if isinstance(snapshots, np.ndarray) else snapshots)
        e_arrays = {}
        for name, arr in (
            ("row_start", row_start),
            ("num_rows", num_rows),
            ("query_id", query_id),
            ("start_turn", start_turn),
        ):
            e_arrays[name] = _frozen(np.asarray(arr, dtype=np.int64))
        e = e_arrays["row_start"].shape
        if len(e) != 1 or any(a.shape != e for a in e_arrays.values()):
            raise ValueError("Rollouts episode arrays must be 1-D and of one length")
        rs, nr = e_arrays["row_start"], e_arrays["num_rows"]
        if np.any(nr < 1) or np.any(rs < 0) or np.any(rs + nr > n):
            raise ValueError("every Rollouts episode has at least one row, inside the row arrays")
        for name, a in e_arrays.items():
            set_(self, name, a)
        set_(self, "gamma", float(gamma))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Rollouts is immutable")

    def __reduce__(self):
        return (_rebuild_rollouts, ({name: getattr(self, name) for name in self.__slots__},))

    # -- the episode view ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.row_start.size)

    def __getitem__(self, e):
        if isinstance(e, slice):
            return self.select(np.arange(len(self))[e])
        e = int(e)
        if e < 0:
            e += len(self)
        lo = int(self.row_start[e])
        hi = lo + int(self.num_rows[e])
        return Trajectory(
            contexts=self.contexts.rows(lo, hi),
            tokens=self.tokens.rows(lo, hi),
            logp=self.logp.rows(lo, hi),
            rewards=self.reward[lo:hi],
            durations=self.duration[lo:hi],
            malformed=self.malformed[lo:hi],
            query_id=int(self.query_id[e]),
            start_turn=int(self.start_turn[e]),
            gamma=self.gamma,
            full_contexts=self.full_contexts.rows(lo, hi) if self.full_contexts is not None else None,
        )

    def __iter__(self) -> Iterator[Trajectory]:
        for e in range(len(self)):
            yield self[e]

    def select(self, idx: np.ndarray) -> Rollouts:
        """Episodes idx (any order, repeats allowed) over the same rows (nothing is copied)."""
        idx = np.asarray(idx, dtype=np.int64)
        return _rebuild_rollouts(
            {
                **{name: getattr(self, name) for name in self.__slots__},
                "row_start": self.row_start[idx],
                "num_rows": self.num_rows[idx],
                "query_id": self.query_id[idx],
                "start_turn": self.start_turn[idx],
            }
        )

    def with_reward(self, reward: np.ndarray) -> Rollouts:
        """The same rows and episodes with reward replaced ((N,) per turn; e.g. a KL-shaped reward)."""
        reward = _frozen(np.array(reward, dtype=np.float64))
        if reward.shape != self.reward.shape:
            raise ValueError(f"Rollouts.with_reward needs shape {self.reward.shape}, got {reward.shape}")
        return _rebuild_rollouts({**{name: getattr(self, name) for name in self.__slots__}, "reward": reward})

    def episode_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(episode index, row index) of every row of every episode, episode by episode in turn order."""
        ep = np.repeat(np.arange(len(self)), self.num_rows)
        first = np.cumsum(self.num_rows) - self.num_rows
        rows = np.repeat(self.row_start - first, self.num_rows) + np.arange(ep.size)
        return ep, rows

    def returns(self) -> np.ndarray:
        """(E,) R of every episode from its start turn (SPEC §1, Eq. 19); equal to [t.ret for t in self]."""
        return segment_returns(self.reward, self.duration, self.row_start, self.num_rows, self.gamma)

    def malformed_rate(self) -> np.ndarray:
        """(E,) the share of each episode's turns that were malformed."""
        ep, rows = self.episode_rows()
        return np.bincount(ep, self.malformed[rows].astype(np.float64), minlength=len(self)) / self.num_rows

    def boundaries_of(self, e: int, trunk: int | None = None) -> list[Boundary]:
        """The recorded boundaries of episode e in turn order (trunk index e unless given)."""
        if self.snapshots is None:
            raise ValueError("this rollout recorded no boundaries")
        lo = int(self.row_start[e])
        t = e if trunk is None else trunk
        return [
            Boundary(trunk=t, k=int(self.turn[i]), snapshot=self.snapshots[i], context=self.contexts[i])
            for i in range(lo, lo + int(self.num_rows[e]))
        ]


def _rebuild_rollouts(fields: dict) -> Rollouts:
    obj = object.__new__(Rollouts)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


@dataclass(frozen=True)
class BoundaryRows(Sequence):
    """The trunk boundaries at one turn k as columns (the columnar form of a tuple of Boundary).

    trunk: (M,) trunk index of each boundary; snapshots: (M, ...) array or length-M list; contexts:
    Ragged (M rows), c_k as recorded at trunk rollout.  Indexing gives the Boundary objects.
    """

    k: int
    trunk: np.ndarray
    snapshots: Any
    contexts: Ragged

    def __post_init__(self) -> None:
        object.__setattr__(self, "trunk", _frozen(np.asarray(self.trunk, dtype=np.int64)))
        m = self.trunk.shape[0]
        if len(self.snapshots) != m or len(self.contexts) != m:
            raise ValueError("BoundaryRows needs one snapshot and one context per boundary")
        if self.k < 0:
            raise ValueError("Boundary.k must be >= 0")

    def __len__(self) -> int:
        return int(self.trunk.size)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(len(self))[i])
        return Boundary(int(self.trunk[i]), self.k, self.snapshots[i], self.contexts[i])

    def __iter__(self) -> Iterator[Boundary]:
        for i in range(len(self)):
            yield self[i]


@dataclass(frozen=True)
class Boundary:
    """Boundary k of a trunk: where siblings fork (Algorithm 1, line "restore snap_k").

    trunk:    index of the trunk in its ReverseTree.
    k:        turn index; the siblings generate turn k.
    snapshot: the environment's snapshot of S_k (opaque, picklable; forking must not re-run the trunk).
    context:  c_k = ψ(S_k) as recorded at trunk rollout.
    """

    trunk: int
    k: int
    snapshot: Any
    context: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "context", _frozen(self.context))
        if self.k < 0:
            raise ValueError("Boundary.k must be >= 0")


@dataclass(frozen=True)
class ReverseTree:
    """Trunks of one iteration and their boundaries, indexed by turn.

    trunks:     the complete θ0 trajectories (no gradient, not in any baseline).
    boundaries: boundaries[k] lists every trunk boundary at turn k (only trunks that reached k).
    """

    trunks: Sequence[Trajectory]
    boundaries: tuple[Sequence[Boundary], ...]

    def __post_init__(self) -> None:
        for k, row in enumerate(self.boundaries):
            if isinstance(row, BoundaryRows) and isinstance(self.trunks, Rollouts):
                if row.k != k:
                    raise ValueError(f"boundary of turn {row.k} filed under turn {k}")
                if np.any(row.trunk < 0) or np.any(row.trunk >= len(self.trunks)):
                    raise ValueError("boundary names a trunk that does not exist")
                t = self.trunks
                if np.any(t.start_turn[row.trunk] + t.num_rows[row.trunk] - 1 < k):
                    raise ValueError("boundary at a turn its trunk never reached")
                continue
            for b in row:
                if b.k != k:
                    raise ValueError(f"boundary of turn {b.k} filed under turn {k}")
                if not (0 <= b.trunk < len(self.trunks)):
                    raise ValueError("boundary names a trunk that does not exist")
                if self.trunks[b.trunk].end_turn < k:
                    raise ValueError("boundary at a turn its trunk never reached")

    @classmethod
    def from_rollout(
        cls, trunks: Sequence[Trajectory], boundaries: Sequence[Sequence[Boundary]], num_turns: int
    ) -> ReverseTree:
        """The tree of these trunks: boundaries[i] are trunk i's boundaries in turn order (as a recorded
        rollout gives them), filed under their turn and renumbered to name trunk i."""
        per_turn: list[list[Boundary]] = [[] for _ in range(num_turns)]
        for i, row in enumerate(boundaries):
            for b in row:
                per_turn[b.k].append(b if b.trunk == i else Boundary(i, b.k, b.snapshot, b.context))
        return cls(tuple(trunks), tuple(tuple(r) for r in per_turn))

    @classmethod
    def from_columns(cls, trunks: Rollouts, num_turns: int) -> ReverseTree:
        """The tree of a recorded rollout's trunks, columnar: boundaries[k] is a BoundaryRows of the rows
        at turn k (no Boundary object is built)."""
        if trunks.snapshots is None:
            raise ValueError("the trunk rollout recorded no boundaries")
        ep, rows = trunks.episode_rows()
        turn = trunks.turn[rows]
        per_turn = []
        for k in range(num_turns):
            sel = np.flatnonzero(turn == k)
            r = rows[sel]
            snaps = trunks.snapshots
            snaps = snaps[r] if isinstance(snaps, np.ndarray) else [snaps[i] for i in r]
            per_turn.append(BoundaryRows(k, ep[sel], snaps, trunks.contexts.take(r)))
        return cls(trunks, tuple(per_turn))

    @property
    def num_turns(self) -> int:
        return len(self.boundaries)


@dataclass(frozen=True)
class TurnBatch:
    """The learner's only input: B rows, each one response in the context it is trained on.

    contexts:   Ragged (B rows) token ids of the training context (RTPO: exactly c_k from rollout).
    tokens:     Ragged (B rows) response token ids; gradient flows only through these (Eq. 80).
    old_logp:   Ragged, rollout log-probs of tokens (π_old, Eq. 6 denominator).
    advantages: Ragged, per-token advantage (most methods repeat one value per row).
    seq_id:     (B,) int64; rows with the same id are one sequence for sequence-level ratios and
                sequence-mean aggregation (GRPO's flattened multi-turn trajectory = several rows).
    weight:     (B,) float64 per-row multiplier (importance weights, SeeUPO's M), 1 by default.
    turn:       (B,) int64, the turn index k of each row (metrics only).
    """

    contexts: Ragged
    tokens: Ragged
    old_logp: Ragged
    advantages: Ragged
    seq_id: np.ndarray
    weight: np.ndarray
    turn: np.ndarray

    def __post_init__(self) -> None:
        b = len(self.tokens)
        if len(self.contexts) != b:
            raise ValueError("TurnBatch.contexts must have one row per response")
        for name in ("old_logp", "advantages"):
            if not np.array_equal(getattr(self, name).offsets, self.tokens.offsets):
                raise ValueError(f"TurnBatch.{name} must align token-for-token with tokens")
        for name, dtype in (("seq_id", np.int64), ("weight", np.float64), ("turn", np.int64)):
            arr = _frozen(np.asarray(getattr(self, name), dtype=dtype))
            if arr.shape != (b,):
                raise ValueError(f"TurnBatch.{name} must have shape ({b},), got {arr.shape}")
            object.__setattr__(self, name, arr)
        if np.any(self.tokens.lengths == 0):
            raise ValueError("TurnBatch rows must hold at least one response token")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.values.size)

    def take(self, idx: np.ndarray) -> TurnBatch:
        idx = np.asarray(idx, dtype=np.int64)
        return TurnBatch(
            contexts=self.contexts.take(idx),
            tokens=self.tokens.take(idx),
            old_logp=self.old_logp.take(idx),
            advantages=self.advantages.take(idx),
            seq_id=self.seq_id[idx],
            weight=self.weight[idx],
            turn=self.turn[idx],
        )

    @staticmethod
    def concat(parts: Sequence[TurnBatch]) -> TurnBatch:
        return TurnBatch(
            contexts=Ragged.concat([p.contexts for p in parts]),
            tokens=Ragged.concat([p.tokens for p in parts]),
            old_logp=Ragged.concat([p.old_logp for p in parts]),
            advantages=Ragged.concat([p.advantages for p in parts]),
            seq_id=np.concatenate([p.seq_id for p in parts]),
            weight=np.concatenate([p.weight for p in parts]),
            turn=np.concatenate([p.turn for p in parts]),
        )
