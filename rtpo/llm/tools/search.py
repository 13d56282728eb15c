"""The `search` tool: a query against a retriever (rtpo.llm.retrieval), the top passages as feedback.

Feedback (Search-R1's passage layout): `Doc i (Title: t) text` per passage, each text cut to
`max_passage_chars` and each title to `max_title_chars` (its whitespace runs made single spaces).  Per-episode state (`SearchState`, immutable, kept in the episode snapshot): the
queries issued and the titles retrieved, so an episode's end metrics can say how many searches it made
and how much of the gold supporting evidence it saw; a sibling forked from a boundary inherits its
trunk's state and re-issues nothing (the results are already in its context).

Bad calls are feedback plus a metric, never an exception: an empty query or one longer than
`max_query_chars` (`tool/search/…` via the registry's invalid-argument path), no passage matching
(`tool/search/empty`), a retrieval server that stays down (`tool/search/server_errors`).

End-of-episode metrics (tool/search/<key>): `episodes`, `searches` (calls that returned passages or
none), `recall` (share of the item's gold supporting titles among the titles retrieved; summed over
episodes that have gold titles, counted in `recall_episodes`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from rtpo.llm.retrieval import RetrievalError, Retriever, make_retriever
from rtpo.llm.tools.base import TOOLS, Tool, ToolResult


@dataclass(frozen=True)
class SearchState:
    """The search history of one episode: queries in order, distinct titles retrieved in order."""

    queries: tuple[str, ...] = ()
    titles: tuple[str, ...] = ()


@TOOLS.register("search")
class SearchTool(Tool):
    """retriever: a Retriever, or a spec {kind: bm25 | http, ...its parameters}; topk: passages per call;
    max_query_chars: longer queries are refused; max_passage_chars: each passage's text is cut to this;
    max_title_chars: each title is cut to this (a title's line breaks become spaces: one title, one line)."""

    name = "search"
    description = (
        "Search the document collection. Returns the most relevant passages (title and text) for the query. "
        "Use short keyword queries; call it again with a new query to follow up on what you found."
    )
    stateful = True

    def __init__(
        self,
        retriever: Retriever | dict | None = None,
        topk: int = 3,
        max_query_chars: int = 500,
        max_passage_chars: int = 600,
        max_title_chars: int = 200,
    ) -> None:
        if retriever is None:
            raise ValueError("the search tool needs a retriever (task.retriever: {kind: bm25, corpus: ...})")
        if isinstance(retriever, dict):
            spec = dict(retriever)
            retriever = make_retriever(spec.pop("kind", "bm25"), **spec)
        if min(topk, max_query_chars, max_passage_chars, max_title_chars) < 1:
            raise ValueError("search tool: topk, max_query_chars, max_passage_chars and max_title_chars must be >= 1")
        self.retriever = retriever
        self.topk = int(topk)
        self.max_query_chars = int(max_query_chars)
        self.max_passage_chars = int(max_passage_chars)
        self.max_title_chars = int(max_title_chars)
        self.parameters = {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": "keywords to search for",
                    "minLength": 1,
                    "maxLength": self.max_query_chars,
                }
            },
            "required": ["query"],
            "additionalProperties": False,
        }
        self._lock = threading.Lock()
        self.calls_issued = 0  # queries sent to the retriever by this tool (tests count re-issues with it)

    def initial_state(self, item: Any) -> SearchState:
        return SearchState()

    def check(self, arguments: dict) -> str | None:
        q = arguments.get("query")
        if isinstance(q, str) and not q.strip():
            return "the search query is empty"
        if isinstance(q, str) and len(q) > self.max_query_chars:
            return f"the search query has {len(q)} characters; at most {self.max_query_chars}"
        return None

    def execute(self, arguments: dict, state: Any = None) -> ToolResult:
        st = state if isinstance(state, SearchState) else SearchState()
        query = " ".join(arguments["query"].split())
        with self._lock:
            self.calls_issued += 1
        try:
            (hits,) = self.retriever.search([query], self.topk)
        except RetrievalError as e:
            return ToolResult(
                f"Error: search is unavailable right now ({e}).",
                ok=False,
                metrics={"server_errors": 1.0},
                state=SearchState(st.queries + (query,), st.titles),
            )
        titles = st.titles + tuple(t for t in dict.fromkeys(h.title for h in hits) if t not in st.titles)
        new = SearchState(st.queries + (query,), titles)
        if not hits:
            return ToolResult("No passage matched the query.", ok=True, metrics={"empty": 1.0}, state=new)
        lines, shown = [], []
        for i, h in enumerate(hits, start=1):
            title = " ".join(h.title.split())
            title = title if len(title) <= self.max_title_chars else title[: self.max_title_chars] + "..."
            text = h.text if len(h.text) <= self.max_passage_chars else h.text[: self.max_passage_chars] + "..."
            lines.append(f"Doc {i} (Title: {title}) {text}")
            shown.append(title)
        metrics = {"passages": float(len(hits))}
        return ToolResult("\n".join(lines), ok=True, metrics=metrics, state=new, found=tuple(shown))

    def end_metrics(self, state: Any, item: Any) -> dict[str, float]:
        st = state if isinstance(state, SearchState) else SearchState()
        out = {"episodes": 1.0, "searches": float(len(st.queries))}
        gold = tuple(getattr(item, "titles", ()) or ())
        if gold:
            seen = set(st.titles)
            out["recall"] = sum(t in seen for t in gold) / len(gold)
            out["recall_episodes"] = 1.0
        return out


__all__ = ["SearchState", "SearchTool"]
