"""The plan as text: the tables `rtpo plan` prints."""

from __future__ import annotations

from rtpo.plan.estimate import Plan
from rtpo.plan.hardware import GB


def _n(x: float) -> str:
    """A count: exact when whole, else one decimal (an expectation under reach/fill < 1)."""
    if abs(x - round(x)) < 1e-9:
        return f"{int(round(x)):,}"
    return f"{x:,.1f}"


def _s(x: float) -> str:
    if x >= 3600:
        return f"{x / 3600:.2f} h"
    if x >= 60:
        return f"{x / 60:.1f} min"
    return f"{x:.3g} s"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


def render(p: Plan) -> str:
    hw, s, a = p.hardware, p.shape, p.assumptions
    it = p.iteration()
    out = [
        f"plan of {p.scenario} ({p.method}) on {hw.name}",
        f"model: {s.name}: {s.params / 1e9:.3g} B parameters ({s.layers} layers, hidden {s.hidden}, "
        f"{s.heads}/{s.kv_heads} heads, vocab {s.vocab})",
        f"assumptions: reach {a.reach:g} (probability of a next turn), fill {a.fill:g} of max_tokens, prompt "
        f"{a.prompt_tokens} tokens, tool output {a.tool_tokens} tokens/turn, think share {a.think_share:g}"
        + ("  [upper bounds]" if a.reach == 1 and a.fill == 1 else ""),
        "",
        "per phase of one iteration:",
    ]
    rows = []
    for ph in p.phases:
        rows.append(
            [
                ph.name,
                _n(ph.trunks),
                _n(ph.boundaries),
                _n(ph.siblings),
                _n(ph.turns),
                _n(ph.generated_tokens),
                _n(ph.trained_rows),
                _n(ph.trained_tokens),
                str(ph.syncs),
                _s(ph.generate_s + ph.prefill_s),
                _s(ph.train_s),
                _s(ph.sync_s),
                _s(ph.time_s),
            ]
        )
    rows.append(
        [
            "iteration",
            _n(it["trunks"]),
            _n(it["boundaries"]),
            _n(it["siblings"]),
            _n(it["turns"]),
            _n(it["generated_tokens"]),
            _n(it["trained_rows"]),
            _n(it["trained_tokens"]),
            _n(it["syncs"]),
            _s(it["generate_s"] + it["prefill_s"]),
            _s(it["train_s"]),
            _s(it["sync_s"]),
            _s(it["time_s"]),
        ]
    )
    head = ["phase", "trunks", "boundaries", "siblings", "turns", "gen tokens", "rows", "trained tok", "syncs"]
    out += _table([*head, "generate", "train", "sync", "total"], rows)
    out.append(
        f"run: {p.iterations} iterations x {_s(it['time_s'])} = {_s(p.iterations * it['time_s'])} "
        f"({_n(p.iterations * it['rollouts'])} rollouts); evaluation not included"
    )
    out += [
        "",
        f"memory per worker (GB; {hw.name}: {hw.memory_gb:.1f} GB per {'device' if hw.kind == 'gpu' else 'host'}):",
    ]
    seen: dict[tuple, list[str]] = {}
    for w in p.workers:
        seen.setdefault(w.items, []).append(w.worker)
    for items, names in seen.items():
        who = names[0] if len(names) == 1 else f"{names[0]} (and {len(names) - 1} like it)"
        parts = ", ".join(f"{k} {v / GB:.3g}" for k, v in items)
        out.append(f"  {who}: {sum(v for _, v in items) / GB:.3g} = {parts}")
    out.append(
        f"devices: {p.devices_needed}; fullest: {p.worst().device} {p.worst().total / GB:.3g} of "
        f"{p.worst().capacity / GB:.3g} GB"
    )
    reason = p.refusal()
    out.append("fits" if reason is None else f"DOES NOT FIT: {reason}")
    out += [f"note: {n}" for n in p.notes]
    return "\n".join(out) + "\n"
