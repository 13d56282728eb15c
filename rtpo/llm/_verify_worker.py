"""math-verify in a worker process: one JSON request per stdin line, one JSON reply per stdout line.

It runs in its own process so the caller can enforce a timeout by killing it: math-verify's own
timeouts use signal.alarm, which only works on a main thread, so they are switched off here
(parsing_timeout=None, timeout_seconds=None) and the parent's deadline replaces them.
Request: {"pred": text containing the answer, "gold": gold answer wrapped in $...$}.
Reply:   {"ok": bool, "pred_parsed": bool} or {"error": "..."}.
"""

import json
import logging
import sys


def main() -> None:
    logging.disable(logging.CRITICAL)  # math-verify logs a warning per call when its timeouts are off
    try:
        from math_verify import parse, verify
    except Exception as e:  # noqa: BLE001 - report why, the parent falls back to numeric comparison
        sys.stdout.write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
        sys.stdout.flush()
        return
    # the first parse/verify imports and compiles lazily (seconds): pay that before reporting ready, so
    # the caller's per-answer timeout measures answers, not start-up
    verify(parse("$x+1$", parsing_timeout=None), parse("\\boxed{1+x}", parsing_timeout=None), timeout_seconds=None)
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            gold = parse(req["gold"], parsing_timeout=None)
            pred = parse(req["pred"], parsing_timeout=None)
            ok = bool(pred) and bool(gold) and bool(verify(gold, pred, timeout_seconds=None))
            reply = {"ok": ok, "pred_parsed": bool(pred), "gold_parsed": bool(gold)}
        except Exception as e:  # noqa: BLE001 - a bad answer is a reply, never a dead worker
            reply = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
