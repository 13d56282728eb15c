"""Retrieval: BM25 over the generated multi-hop corpus (recall bounds from its construction, determinism,
the on-disk index cache), the Search-R1 HTTP client against a local server on 127.0.0.1 (results equal
the in-process index; a server that is down, slow or answers garbage is bounded retries, then an error),
and the search tool turning every failure into feedback plus a metric."""

from __future__ import annotations

import collections
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("bm25s", reason="the search extra (bm25s) is not installed")

from rtpo.llm.retrieval import BM25Retriever, CorpusError, HTTPRetriever, RetrievalError, read_corpus  # noqa: E402
from rtpo.llm.tasks.qa import corpus_from_contexts, load_qa, write_multihop  # noqa: E402
from rtpo.llm.tools import ToolSet  # noqa: E402
from rtpo.llm.tools.search import SearchState, SearchTool  # noqa: E402

PEOPLE_PER_CITY = 2


@pytest.fixture(scope="module")
def multihop(tmp_path_factory):
    root = tmp_path_factory.mktemp("multihop")
    task = load_qa(write_multihop(root / "train.json", 40, seed=0, people_per_city=PEOPLE_PER_CITY), "hotpotqa")
    corpus = corpus_from_contexts([task], root / "corpus.jsonl")
    return task, corpus, BM25Retriever(corpus, cache_dir=root / "index")


def test_bm25_recall_meets_the_bounds_of_the_construction(multihop):
    """The bridge paragraph is the only one with the person's name: top 1 for the question.  The city's
    name occurs in its paragraph and in those of the <= PEOPLE_PER_CITY people born there (and nowhere
    else): the city's paragraph is within the top 1 + PEOPLE_PER_CITY for a search of the city."""
    task, _, r = multihop
    bridge_at_1 = []
    city_within = []
    for item in task:
        person, city = item.titles
        bridge_at_1.append(r.search([item.raw_question], 1)[0][0].title == person)
        hits = r.search([city], 1 + PEOPLE_PER_CITY)[0]
        city_within.append(city in [h.title for h in hits])
    assert all(bridge_at_1) and all(city_within)
    # measured beside the bound: the city is usually first (its paragraph is the short one)
    firsts = sum(r.search([item.titles[1]], 1)[0][0].title == item.titles[1] for item in task) / len(task)
    assert firsts > 0.5


def test_bm25_is_deterministic_cached_on_disk_and_in_memory(multihop, tmp_path):
    task, corpus, r = multihop
    again = BM25Retriever(corpus, cache_dir=r.index_dir.parent)
    assert r.built is True and again.built is False  # the second one loaded the first one's index
    queries = [i.raw_question for i in task] + ["river", "zzz unknown words", "the a of"]
    assert again.search(queries, 5) == r.search(queries, 5)
    before = again.queries
    again.search(queries[:3], 5)
    assert again.queries == before and again.cache_hits >= 3  # asked again: nothing re-scored
    assert r.search(["zzz unknown words"], 5) == [[]]  # no query term in the corpus: nothing, not noise
    other = BM25Retriever(corpus, cache_dir=tmp_path, k1=0.9)  # other parameters: another index
    assert other.built and other.index_dir != r.index_dir


def test_ties_are_broken_by_corpus_order(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text("".join(json.dumps({"id": f"d{i}", "title": f"T{i}", "text": "alpha beta"}) + "\n" for i in range(6)))
    r = BM25Retriever(p, cache_dir=tmp_path / "idx")
    assert [h.id for h in r.search(["alpha"], 4)[0]] == ["d0", "d1", "d2", "d3"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the corpus is empty"),
        ("{bad\n", ":1: invalid JSON"),
        ('{"id": 1, "title": "t"}\n', ":1: missing string field 'text'"),
        ('{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n', ":2: duplicate id"),
        ('{"id": 1, "title": "", "text": "  "}\n', ":1: empty passage"),
        ("[1]\n", ":1: expected a JSON object"),
    ],
)
def test_bad_corpus_lines_are_one_line_errors(tmp_path, text, message):
    p = tmp_path / "corpus.jsonl"
    p.write_text(text)
    with pytest.raises(CorpusError, match=message):
        read_corpus(p)
    with pytest.raises(CorpusError, match="no such corpus file"):
        read_corpus(tmp_path / "missing.jsonl")


def test_searchr1_contents_layout(tmp_path):
    p = tmp_path / "wiki.jsonl"
    p.write_text(json.dumps({"id": "0", "contents": '"Ed Wood"\nEdward Wood was an American filmmaker.'}) + "\n")
    assert read_corpus(p) == (["0"], ["Ed Wood"], ["Edward Wood was an American filmmaker."])


# -- the HTTP client against a server on 127.0.0.1 -------------------------------------------------------


class _Server:
    """A Search-R1-style /retrieve server over an in-process BM25 index; mode: ok | slow | garbage."""

    def __init__(self, retriever: BM25Retriever) -> None:
        self.mode = "ok"
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                if outer.mode == "slow":
                    time.sleep(1.0)
                if outer.mode == "garbage":
                    data = b"<html>502 Bad Gateway</html>"
                else:
                    res = retriever.search(body["queries"], body["topk"])
                    data = json.dumps(
                        {
                            "result": [
                                [
                                    {"document": {"id": h.id, "contents": f'"{h.title}"\n{h.text}'}, "score": h.score}
                                    for h in hits
                                ]
                                for hits in res
                            ]
                        }
                    ).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (slow mode)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/retrieve"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(multihop):
    s = _Server(multihop[2])
    yield s
    s.close()


def test_http_client_equals_the_in_process_index(multihop, server):
    task, _, r = multihop
    client = HTTPRetriever(server.url, timeout_s=5, retries=0)
    queries = [task[i].raw_question for i in range(5)]
    got = client.search(queries, 3)
    want = r.search(queries, 3)
    assert [[(h.id, h.title, h.text) for h in hits] for hits in got] == [
        [(h.id, h.title, h.text) for h in hits] for hits in want
    ]
    assert server.requests[0] == {"queries": queries, "topk": 3, "return_scores": True}
    client.search(queries[:2], 3)
    assert len(server.requests) == 1 and client.cache_hits == 2  # cached: not sent again


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/retrieve"


def test_a_server_that_is_down_slow_or_garbled_is_retried_then_an_error(server):
    down = HTTPRetriever(_closed_port_url(), timeout_s=1, retries=2, backoff_s=0.01)
    with pytest.raises(RetrievalError, match="failed 3 times"):
        down.search(["x"], 3)
    assert down.requests == 3 and down.failures == 3
    server.mode = "slow"
    slow = HTTPRetriever(server.url, timeout_s=0.2, retries=1, backoff_s=0.01)
    t0 = time.monotonic()
    with pytest.raises(RetrievalError, match="timed out|TimeoutError"):
        slow.search(["x"], 3)
    assert time.monotonic() - t0 < 5 and slow.failures == 2  # bounded: 2 attempts of 0.2 s + backoff
    server.mode = "garbage"
    garbled = HTTPRetriever(server.url, timeout_s=2, retries=1, backoff_s=0.01)
    with pytest.raises(RetrievalError, match="JSONDecodeError|ValueError"):
        garbled.search(["x"], 3)
    with pytest.raises(ValueError, match="http:// or https://"):
        HTTPRetriever("ftp://x")


def test_the_search_tool_turns_failures_into_feedback_and_metrics(multihop):
    task, _, r = multihop
    tools = ToolSet([SearchTool(HTTPRetriever(_closed_port_url(), timeout_s=0.5, retries=0), max_query_chars=50)])
    m = collections.Counter()
    st = tools.initial_state(task[0])
    res = tools.call("search", {"query": "anything"}, st, m)
    assert not res.ok and res.text.startswith("Error: search is unavailable") and m["tool/search/server_errors"] == 1
    for args, why in [
        ({"query": ""}, "empty"),
        ({"query": "x" * 10240}, "10240 characters"),
        ({}, "query"),
        ({"query": 3}, "query"),
    ]:
        res = tools.call("search", args, st, m)
        assert not res.ok and why in res.text and res.state is st
    assert m["tool/invalid_arguments"] == 4
    good = ToolSet([SearchTool(r, topk=2)])
    res = good.call("search", {"query": task[0].raw_question}, good.initial_state(task[0]), m)
    assert res.ok and res.text.startswith(f"Doc 1 (Title: {task[0].titles[0]})") and res.text.count("\nDoc ") == 1
    s: SearchState = res.state["search"]
    assert s.queries == (task[0].raw_question,) and s.titles[0] == task[0].titles[0]
    end = good.tools["search"].end_metrics(s, task[0])
    assert end["searches"] == 1 and end["recall"] == 0.5 and end["recall_episodes"] == 1
