"""Retrieval for the search tool: an in-process BM25 index over a local corpus, and a client for a
dense-retrieval server that speaks the Search-R1 / verl `/retrieve` HTTP API.

Corpus files are JSONL, one passage per line: `{"id", "title", "text"}` (rtpo's layout, also what
`rtpo.llm.tasks.qa.corpus_from_contexts` writes), or Search-R1's wiki-18 layout `{"id", "contents"}`
where `contents` is `"Title"\\ntext`.  A bad line is a one-line `CorpusError` naming file and line.

BM25 (`bm25s`): chosen because it is a maintained, numpy-only implementation (sparse matrices, no
JVM as Pyserini needs, no server as Elasticsearch needs) that indexes ~1M passages per minute and saves
its index as plain .npy/.json files.  The index is built once per (corpus content, parameters) and
cached on disk under `cache_dir/bm25-<sha256 prefix>/` (written to a temporary folder and renamed, so
concurrent builders never see half an index).  Ranking is deterministic: scores from the index, ties
broken by corpus order, passages with score 0 (no query term) left out.  A query's result is cached
in memory, so re-asking never re-scores.

HTTP (`task.retriever.url`): POST `{"queries": [...], "topk": k, "return_scores": true}` to the
server's `/retrieve`; the answer is `{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`
(or documents without the `score` wrapper).  A server that is down, slow, trickling or answers garbage
is retried `retries` times with a doubling backoff, each attempt bounded in total by `timeout_s` and its
answer by `max_response_bytes`; then `RetrievalError` (HTTPRetriever lists every failure class), which
the search tool turns into "Error: ..." feedback and the metric `tool/search/server_errors`, so the run
goes on.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import shutil
import socket
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rtpo.core.registry import Registry

_MANIFEST = "rtpo-manifest.json"  # sha256 of every file of a cached BM25 index, written when it is built


class CorpusError(ValueError):
    """A corpus file that cannot be read; the message names file and line."""


class RetrievalError(RuntimeError):
    """Retrieval failed for reasons outside the model's control (server down, slow, malformed answer)."""


@dataclass(frozen=True)
class Passage:
    """One retrieved passage: corpus id, title, text and the retriever's score."""

    id: str
    title: str
    text: str
    score: float


class Retriever(Protocol):
    name: str

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """The top-k passages of each query, best first (fewer when fewer match)."""


RETRIEVERS: Registry = Registry("retriever")


def _split_contents(contents: str) -> tuple[str, str]:
    """Search-R1's `contents`: the first line is the title in double quotes, the rest the text.

    Only the enclosing pair of quotes goes: `""Weird Al" Yankovic"` is the title `"Weird Al" Yankovic`."""
    head, _, rest = contents.partition("\n")
    head = head.strip()
    if len(head) >= 2 and head[0] == head[-1] == '"':
        head = head[1:-1]
    return head, rest.strip()


def read_corpus(path: str | os.PathLike) -> tuple[list[str], list[str], list[str]]:
    """(ids, titles, texts) of a corpus JSONL file in either layout of the module docstring."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CorpusError(f"{path}: no such corpus file")
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    seen: dict[str, int] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise CorpusError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x})") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError) as e:
                raise CorpusError(f"{where}: invalid JSON ({getattr(e, 'msg', 'too deep or too long')})") from None
            if not isinstance(rec, dict):
                raise CorpusError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            if "contents" in rec and "text" not in rec:
                if not isinstance(rec["contents"], str):
                    raise CorpusError(f"{where}: field 'contents' must be a string")
                title, text = _split_contents(rec["contents"])
            else:
                title, text = rec.get("title", ""), rec.get("text")
                if not isinstance(text, str):
                    raise CorpusError(f"{where}: missing string field 'text' (or Search-R1's 'contents')")
                if not isinstance(title, str):
                    raise CorpusError(f"{where}: field 'title' must be a string")
            if not (title.strip() or text.strip()):
                raise CorpusError(f"{where}: empty passage")
            pid = str(rec.get("id", len(ids)))
            if pid in seen:
                raise CorpusError(f"{where}: duplicate id {pid[:60]!r} (first at line {seen[pid]})")
            seen[pid] = lineno
            ids.append(pid)
            titles.append(title.strip())
            texts.append(text.strip())
    if not ids:
        raise CorpusError(f"{path}: the corpus is empty")
    return ids, titles, texts


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _import_bm25s():
    """bm25s, imported without numba.

    bm25s imports numba (and so llvmlite) at import time when it is installed, to offer a JIT backend
    this module does not use (scores come from `get_scores`, numpy).  vLLM's CPU platform, when an
    engine starts, walks every loaded module's namespace to rebind Triton kernels and fails on
    llvmlite's FFI wrappers (AttributeError in vllm.triton_utils.dispatcher) — so a retriever built
    before the engine would make the engine fail to start.  Hiding numba during the import keeps
    bm25s on its numpy path; a numba that something else already imported is left alone.
    """
    import sys

    hide = "numba" not in sys.modules
    saved = {k: sys.modules.get(k) for k in ("numba",)}
    try:
        if hide:
            sys.modules["numba"] = None  # type: ignore[assignment] - makes `import numba` raise ImportError
        import bm25s
    except ModuleNotFoundError:  # pragma: no cover - bm25s is in the search extra
        raise ModuleNotFoundError("BM25 retrieval needs bm25s: pip install 'rtpo[search]'") from None
    finally:
        if hide:
            if saved["numba"] is None:
                sys.modules.pop("numba", None)
            else:
                sys.modules["numba"] = saved["numba"]
    return bm25s


class _QueryCache:
    """A bounded LRU of query -> passages, thread-safe (tool calls of a batch run in threads)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._d: OrderedDict[tuple[str, int], list[Passage]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            if key in self._d:
                self._d.move_to_end(key)
                return self._d[key]
        return None

    def put(self, key, value) -> None:
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.size:
                self._d.popitem(last=False)


@RETRIEVERS.register("bm25")
class BM25Retriever:
    """BM25 over a local corpus (bm25s, Lucene's variant), index cached on disk.

    corpus:    corpus JSONL (module docstring); cache_dir: where indexes are kept (default: beside the
               corpus, in `.rtpo-index/`); k1, b: BM25's parameters; stopwords: bm25s's list name
               ("en") or none; cache_size: queries remembered in memory.
    Counters: `queries` (queries scored against the index), `cache_hits`; `built` (this process built the
    index), `rebuilt` (the cached copy was damaged: a file changed, missing or added, or it did not load).
    """

    name = "bm25"

    def __init__(
        self,
        corpus: str | os.PathLike,
        cache_dir: str | os.PathLike | None = None,
        k1: float = 1.5,
        b: float = 0.75,
        stopwords: str | None = "en",
        cache_size: int = 65536,
    ) -> None:
        self._bm25s = _import_bm25s()
        self.corpus_path = os.fspath(corpus)
        self.ids, self.titles, self.texts = read_corpus(self.corpus_path)
        self.k1, self.b, self.stopwords = float(k1), float(b), stopwords
        digest = _file_digest(self.corpus_path)
        params = f"k1={self.k1},b={self.b},stop={stopwords},n={len(self.ids)}"
        key = hashlib.sha256(f"{digest}|{params}|bm25s-{self._bm25s.__version__}".encode()).hexdigest()[:20]
        root = Path(cache_dir) if cache_dir is not None else Path(self.corpus_path).parent / ".rtpo-index"
        self.index_dir = root / f"bm25-{key}"
        self.built = False
        self._model = self._load_or_build()
        self._vocab = self._model.vocab_dict
        self._cache = _QueryCache(cache_size)
        self.queries = 0
        self.cache_hits = 0

    def _tokenize(self, texts: list[str]):
        return self._bm25s.tokenize(texts, stopwords=self.stopwords or None, show_progress=False, return_ids=False)

    def _load_or_build(self):
        """The cached index when it is whole (every file's sha256 as recorded when it was built, and it
        loads and answers), else a fresh build; a damaged cache is removed and rebuilt (`rebuilt`)."""
        bm25s = self._bm25s
        self.rebuilt = False
        if self.index_dir.exists():
            model = self._load_checked()
            if model is not None:
                return model
            self.rebuilt = True
            shutil.rmtree(self.index_dir, ignore_errors=True)
            if self.index_dir.exists():  # a file where the index folder should be
                self.index_dir.unlink()
        docs = [f"{t}\n{x}" for t, x in zip(self.titles, self.texts)]
        model = bm25s.BM25(k1=self.k1, b=self.b)
        model.index(bm25s.tokenize(docs, stopwords=self.stopwords or None, show_progress=False), show_progress=False)
        self.index_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.index_dir.with_name(self.index_dir.name + f".tmp{os.getpid()}-{threading.get_ident()}")
        model.save(str(tmp), show_progress=False)
        manifest = {f.name: _file_digest(str(f)) for f in sorted(tmp.iterdir()) if f.is_file()}
        (tmp / _MANIFEST).write_text(json.dumps(manifest, sort_keys=True))
        try:
            os.replace(tmp, self.index_dir)
        except OSError:  # another process finished the same index first: keep its copy
            shutil.rmtree(tmp, ignore_errors=True)
        self.built = True
        return model

    def _load_checked(self):
        """The cached index, or None when any file differs from the manifest or it does not load whole."""
        try:
            manifest = json.loads((self.index_dir / _MANIFEST).read_text())
            files = {f.name for f in self.index_dir.iterdir() if f.is_file()} - {_MANIFEST}
            if not isinstance(manifest, dict) or set(manifest) != files:
                return None
            if any(_file_digest(str(self.index_dir / name)) != digest for name, digest in manifest.items()):
                return None
            model = self._bm25s.BM25.load(str(self.index_dir), mmap=False, show_progress=False)
            if int(model.scores["num_docs"]) != len(self.ids):
                return None
            return model
        except Exception:  # noqa: BLE001 - whatever a damaged cache does on load means: rebuild it
            return None

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for `query` (0 where no query term occurs)."""
        tokens = [t for t in self._tokenize([query])[0] if t in self._vocab]
        if not tokens:
            return np.zeros(len(self.ids), dtype=np.float32)
        return np.asarray(self._model.get_scores(tokens))

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        out = []
        for q in queries:
            key = (q, int(topk))
            hit = self._cache.get(key)
            if hit is not None:
                self.cache_hits += 1
                out.append(hit)
                continue
            self.queries += 1
            s = self.scores(q)
            cand = np.flatnonzero(s > 0)
            if cand.size > topk:  # the k best; ties at the k-th score all kept, then broken by corpus order
                kth = np.partition(s[cand], cand.size - topk)[cand.size - topk]
                cand = cand[s[cand] >= kth]
            order = cand[np.lexsort((cand, -s[cand]))][:topk]
            res = [Passage(self.ids[i], self.titles[i], self.texts[i], float(s[i])) for i in order]
            self._cache.put(key, res)
            out.append(res)
        return out


def _kill_socket(conn: http.client.HTTPConnection) -> None:
    """The attempt's deadline passed: shut its socket, so a read blocked on it returns at once."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _finite(x: Any, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise ValueError(f"{what} must be a finite number, got {str(x)[:40]!r}")
    return float(x)


def _string(x: Any, what: str) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool):  # ids are often numbers
        return str(x)
    raise ValueError(f"{what} must be a string, got {type(x).__name__}")


@RETRIEVERS.register("http")
class HTTPRetriever:
    """A client of a Search-R1 / verl retrieval server (e5 + FAISS, or any server with its API).

    url: the endpoint, e.g. http://127.0.0.1:8000/retrieve; timeout_s: the total time one attempt may
    take, connection to last byte (a watchdog shuts the socket at the deadline, so a server that trickles
    a byte at a time cannot stretch it; the host name's lookup is the resolver's and not bounded: give
    an address or a name it answers at once); max_response_bytes: a larger answer is a failed attempt;
    retries: further attempts after a failure, with a backoff doubling from backoff_s.  A failure is
    anything an attempt can meet: connection refused or reset, the deadline, an HTTP status other than
    200, a bad status line, a truncated body (IncompleteRead, a body shorter than its Content-Length),
    an answer that is not UTF-8 JSON or is nested too deep, or one whose shape or values are wrong
    (`score: null`, a result that is not a list, ...).  After the last attempt: `RetrievalError`.
    Counters: `requests` (attempts), `failures` (attempts that failed), `cache_hits`.
    """

    name = "http"

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        cache_size: int = 65536,
        max_response_bytes: int = 16 << 20,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"retriever url must start with http:// or https://, got {str(url)[:80]!r}")
        parts = urllib.parse.urlsplit(url)
        if not parts.hostname:
            raise ValueError(f"retriever url has no host: {url[:80]!r}")
        self.url, self.timeout_s, self.retries, self.backoff_s = url, float(timeout_s), int(retries), float(backoff_s)
        self.max_response_bytes = int(max_response_bytes)
        self._parts = parts
        self._cache = _QueryCache(cache_size)
        self.requests = 0
        self.failures = 0
        self.cache_hits = 0

    def _post(self, queries: list[str], topk: int) -> Any:
        """One attempt: the parsed JSON answer, or an exception; never longer than timeout_s."""
        body = json.dumps({"queries": queries, "topk": topk, "return_scores": True}).encode()
        p = self._parts
        cls = http.client.HTTPSConnection if p.scheme == "https" else http.client.HTTPConnection
        deadline = time.monotonic() + self.timeout_s
        conn = cls(p.hostname, p.port, timeout=self.timeout_s)
        watchdog = threading.Timer(self.timeout_s, _kill_socket, (conn,))
        watchdog.daemon = True
        watchdog.start()
        try:
            path = (p.path or "/") + (f"?{p.query}" if p.query else "")
            conn.connect()
            if time.monotonic() >= deadline:  # connected after the watchdog looked: it saw no socket to shut
                raise TimeoutError(f"no complete answer within {self.timeout_s:g} s")
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status} {str(resp.reason)[:60]}")
            data = bytearray()
            while len(data) <= self.max_response_bytes:
                chunk = resp.read(min(1 << 16, self.max_response_bytes + 1 - len(data)))
                if not chunk:
                    break
                data += chunk
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no complete answer within {self.timeout_s:g} s")
            if len(data) > self.max_response_bytes:
                raise ValueError(f"answer larger than max_response_bytes={self.max_response_bytes}")
            declared = resp.getheader("Content-Length")
            if declared is not None and declared.strip().isdigit() and int(declared) != len(data):
                raise http.client.IncompleteRead(bytes(data[:0]), int(declared) - len(data))
        except (OSError, http.client.HTTPException) as e:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no complete answer within {self.timeout_s:g} s") from None
            raise e
        finally:
            watchdog.cancel()
            conn.close()
        return json.loads(bytes(data).decode("utf-8"))

    @staticmethod
    def _parse(answer: Any, n: int, topk: int) -> list[list[Passage]]:
        if not isinstance(answer, dict) or not isinstance(answer.get("result"), list) or len(answer["result"]) != n:
            raise ValueError(f"expected {{'result': [...]}} with {n} lists")
        out = []
        for per_query in answer["result"]:
            if not isinstance(per_query, list):
                raise ValueError("a query's result is not a list")
            hits = []
            for entry in per_query[:topk]:
                if not isinstance(entry, dict):
                    raise ValueError("a result entry is not an object")
                if "document" in entry:
                    doc, score = entry["document"], _finite(entry.get("score", 0.0), "score")
                else:
                    doc, score = entry, 0.0
                if not isinstance(doc, dict):
                    raise ValueError("a result entry has no document object")
                if "contents" in doc:
                    title, text = _split_contents(_string(doc["contents"], "contents"))
                else:
                    title, text = _string(doc.get("title", ""), "title"), _string(doc.get("text", ""), "text")
                hits.append(Passage(_string(doc.get("id", ""), "id"), title, text, score))
            out.append(hits)
        return out

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        results: list[list[Passage] | None] = [self._cache.get((q, topk)) for q in queries]
        self.cache_hits += sum(r is not None for r in results)
        todo = [i for i, r in enumerate(results) if r is None]
        if todo:
            ask = [queries[i] for i in todo]
            last = ""
            for attempt in range(self.retries + 1):
                if attempt:
                    time.sleep(self.backoff_s * 2 ** (attempt - 1))
                self.requests += 1
                try:
                    got = self._parse(self._post(ask, topk), len(ask), topk)
                    break
                # every way an attempt can fail on what the server sent (or did not send)
                except (OSError, http.client.HTTPException, ValueError, TypeError, RecursionError) as e:
                    self.failures += 1
                    last = f"{type(e).__name__}: {' '.join(str(e).split())[:120]}"
            else:
                raise RetrievalError(f"retrieval server {self.url} failed {self.retries + 1} times (last: {last})")
            for i, hits in zip(todo, got):
                self._cache.put((queries[i], topk), hits)
                results[i] = hits
        return [r if r is not None else [] for r in results]


def make_retriever(kind: str, **params: Any) -> Retriever:
    return RETRIEVERS.build(kind, **params)


__all__ = [
    "RETRIEVERS",
    "BM25Retriever",
    "CorpusError",
    "HTTPRetriever",
    "Passage",
    "RetrievalError",
    "Retriever",
    "make_retriever",
    "read_corpus",
]
