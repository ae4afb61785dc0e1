"""Load test of `ragkit serve` on loopback: N requests from C concurrent OpenAI-client
threads, streaming, each with a timeout. Prints what became of every request and how
fast the first token came.

    .venv/bin/python eval/bench_serve.py                       # ingests corpora/nda, starts a server
    .venv/bin/python eval/bench_serve.py --url http://127.0.0.1:8000 --token T   # an already running one

Each thread holds conversations: a first question on a document, then follow-ups on the
same document with the earlier turns in `messages` (the server reuses the KV cache
when the request before it was on the same document). A 429 or 503 is retried after its
Retry-After, up to --retries times, as OpenAI clients do.

Outcomes: answered (a streamed answer with text, final citations and usage), refused
(429/503 responses, and requests that were still refused after the retries), lost
(timeouts, dropped connections, a stream that ended without its final chunk, 5xx other
than 503; must be 0), wrong (an empty answer, a final chunk without its fields, an error
that is not OpenAI-shaped, an unexpected status).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ragkit  # noqa: E402,F401  (offline switches)

EXE = Path(sys.executable).parent / "ragkit"
RAGKIT = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "ragkit.cli"]
DOCS = ["ai-osi-stack-mutual-nda.md", "common-paper-mutual-nda-v1-standard-terms.md"]
QUESTIONS = [
    "How long do the confidentiality obligations survive?",
    "Which law governs the agreement?",
    "What must the receiving party do with confidential information when the agreement ends?",
    "Can either party assign the agreement?",
    "What is excluded from confidential information?",
]
ERROR_KEYS = {"message", "type", "param", "code"}


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.answered = 0
        self.refused_429 = 0  # responses
        self.refused_503 = 0
        self.gave_up = 0  # requests still refused after the retries
        self.lost: list[str] = []
        self.wrong: list[str] = []
        self.ttft: list[float] = []
        self.server_ttft: list[float] = []  # the server's own retrieve + prefill + first token (no queue wait)
        self.total: list[float] = []
        self.follow_share: list[float] = []  # cached / prompt tokens of follow-ups
        self.first_share: list[float] = []

    def add(self, **kw):
        with self.lock:
            for k, v in kw.items():
                cur = getattr(self, k)
                if isinstance(cur, list):
                    cur.append(v)
                else:
                    setattr(self, k, cur + v)


def one_request(client, model: str, messages: list[dict], timeout: float, retries: int, tally: Tally,
                follow_up: bool) -> str | None:
    """Send one streaming chat request (retrying 429/503); the answer text, or None."""
    import openai

    for attempt in range(retries + 1):
        t0 = time.perf_counter()
        first = None
        try:
            stream = client.chat.completions.create(model=model, messages=messages, stream=True, timeout=timeout,
                                                    stream_options={"include_usage": True})
            parts, final, usage = [], None, None
            for chunk in stream:
                if chunk.choices:
                    delta = chunk.choices[0].delta.content
                    if delta:
                        if first is None:
                            first = time.perf_counter() - t0
                        parts.append(delta)
                    if chunk.choices[0].finish_reason:
                        final = chunk.model_dump()
                if chunk.usage is not None:
                    usage = chunk.usage
            text = "".join(parts)
            if final is None or usage is None:
                tally.add(lost=f"stream ended without its final chunk/usage ({len(text)} chars)")
                return None
            answer = text.partition("\n\nSources:\n")[0].strip()
            if not answer or not isinstance(final.get("citations"), list) or not isinstance(final.get("ragkit"), dict):
                tally.add(wrong=f"answer {answer[:60]!r}, final chunk keys {sorted(final)}")
                return None
            tally.add(answered=1, ttft=first if first is not None else time.perf_counter() - t0,
                      total=time.perf_counter() - t0)
            timings = final["ragkit"].get("timings") or {}
            if "ttft_s" in timings:
                tally.add(server_ttft=timings.get("retrieve_s", 0) + timings.get("prompt_s", 0) + timings["ttft_s"])
            share = (usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0) / max(1, usage.prompt_tokens)
            tally.add(**({"follow_share": share} if follow_up else {"first_share": share}))
            return text
        except openai.APIStatusError as exc:
            body = exc.body if isinstance(exc.body, dict) else None
            if body is None or set(body) != ERROR_KEYS:  # the client hands over the "error" object
                tally.add(wrong=f"{exc.status_code} with body {str(exc.body)[:120]}")
                return None
            if exc.status_code in (429, 503):
                tally.add(**({"refused_429": 1} if exc.status_code == 429 else {"refused_503": 1}))
                if attempt < retries:
                    wait = float(exc.response.headers.get("retry-after", "2") or 2)
                    time.sleep(min(wait, 30.0))
                    continue
                tally.add(gave_up=1)
                return None
            if exc.status_code >= 500:
                tally.add(lost=f"{exc.status_code}: {body.get('message')}")
            else:
                tally.add(wrong=f"{exc.status_code}: {body.get('message')}")
            return None
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            tally.add(lost=f"{type(exc).__name__}: {exc}")
            return None
        except Exception as exc:  # anything else the client raised
            tally.add(lost=f"{type(exc).__name__}: {exc}")
            return None
    return None


def worker(i: int, n: int, url: str, token: str | None, timeout: float, retries: int, tally: Tally) -> None:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key=token or "unused", max_retries=0, timeout=timeout)
    doc = DOCS[i % len(DOCS)]
    history: list[dict] = []
    for k in range(n):
        q = QUESTIONS[(i + k) % len(QUESTIONS)]
        follow_up = bool(history)
        messages = history + [{"role": "user", "content": q}]
        text = one_request(client, f"ragkit:{doc}", messages, timeout, retries, tally, follow_up)
        if text is None:
            history = []
        else:
            history = (messages + [{"role": "assistant", "content": text}])[-4:]  # the last two turns


def start_server(store: Path, max_queue: int, env: dict, log_dir: Path) -> tuple[subprocess.Popen, str]:
    out, err = log_dir / "serve.out", log_dir / "serve.err"
    proc = subprocess.Popen([*RAGKIT, "serve", "--store", str(store), "--port", "0", "--json", "--max-queue", str(max_queue)],
                            stdout=open(out, "wb"), stderr=open(err, "wb"), cwd=ROOT, env=env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"ragkit serve exited with {proc.returncode}:\n{err.read_text()[-3000:]}")
        lines = [x for x in out.read_text().splitlines() if x.startswith("{")]
        if lines:
            return proc, json.loads(lines[-1])["url"]
        time.sleep(0.25)
    proc.kill()
    sys.exit(f"ragkit serve did not start within 180 s:\n{err.read_text()[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (default: start one)")
    ap.add_argument("--token")
    ap.add_argument("--store", type=Path, help="store for the started server (default: corpora/nda ingested into a temp dir)")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    ap.add_argument("--retries", type=int, default=3, help="retries of a 429/503, after its Retry-After")
    ap.add_argument("--max-queue", type=int, default=4)
    ap.add_argument("--n-ctx", type=int, default=2048, help="2048: each sample NDA fits whole, so follow-ups share the prefix")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()

    import httpx

    proc = None
    log_dir = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    env = {**os.environ, "RAGKIT_GENERATOR__N_CTX": str(args.n_ctx), "RAGKIT_GENERATOR__MAX_TOKENS": str(args.max_tokens),
           "PYTHONUNBUFFERED": "1"}
    url = args.url
    if url is None:
        store = args.store
        if store is None:
            store = log_dir / "store"
            res = subprocess.run([*RAGKIT, "ingest", str(ROOT / "corpora" / "nda"), "--store", str(store), "--json"],
                                 cwd=ROOT, env=env, capture_output=True, text=True)
            if res.returncode != 0:
                sys.exit(f"ingest failed: {res.stderr[-2000:]}")
        t0 = time.perf_counter()
        proc, url = start_server(store, args.max_queue, env, log_dir)
        print(f"server {url} ready in {time.perf_counter() - t0:.1f}s (n_ctx {args.n_ctx}, max_tokens {args.max_tokens}, "
              f"max_queue {args.max_queue}); log {log_dir}")
    try:
        tally = Tally()
        per = [args.requests // args.concurrency + (1 if i < args.requests % args.concurrency else 0)
               for i in range(args.concurrency)]
        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(i, per[i], url, args.token, args.timeout, args.retries, tally))
                   for i in range(args.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(args.timeout * (max(per) + 1) * (args.retries + 1))
        wall = time.perf_counter() - t0
        stuck = sum(t.is_alive() for t in threads)
        time.sleep(0.5)
        health = httpx.get(url + "/health", trust_env=False, timeout=10).json()
        # then one conversation alone: a question and two follow-ups, nothing in between
        alone = Tally()
        worker(0, 3, url, args.token, args.timeout, args.retries, alone)

        lost = len(tally.lost) + stuck
        print(f"{args.requests} requests from {args.concurrency} threads in {wall:.1f}s")
        print(f"answered {tally.answered}; refused: {tally.refused_429} x 429, {tally.refused_503} x 503 "
              f"(retried after Retry-After; {tally.gave_up} still refused after {args.retries} retries); "
              f"lost {lost}; wrong {len(tally.wrong)}")
        print(f"time to first token (client side, queue wait included): p50 {pct(tally.ttft, 50):.2f}s, "
              f"p95 {pct(tally.ttft, 95):.2f}s; whole answer p50 {pct(tally.total, 50):.2f}s; "
              f"server side (retrieve + prefill + first token): p50 {pct(tally.server_ttft, 50):.2f}s, "
              f"p95 {pct(tally.server_ttft, 95):.2f}s")
        if tally.follow_share:
            hits = sum(s > 0.5 for s in tally.follow_share)
            print(f"follow-ups under load (interleaved with other documents): cached share of the prompt mean "
                  f"{statistics.mean(tally.follow_share):.2f}, median {statistics.median(tally.follow_share):.2f}; "
                  f"{hits}/{len(tally.follow_share)} over half cached "
                  f"(first questions: mean {statistics.mean(tally.first_share) if tally.first_share else float('nan'):.2f})")
        if alone.follow_share:
            print(f"follow-ups alone (question + 2 follow-ups, no other traffic): cached share "
                  f"{', '.join(f'{x:.2f}' for x in alone.follow_share)}; first token p50 {pct(alone.ttft[1:], 50):.2f}s "
                  f"vs {alone.ttft[0]:.2f}s for the first question")
        lost += len(alone.lost)
        tally.wrong += alone.wrong
        print(f"/health after: {json.dumps(health)}")
        for what, items in (("lost", tally.lost), ("wrong", tally.wrong)):
            for x in items[:5]:
                print(f"  {what}: {x}")
        ok = lost == 0 and not tally.wrong and not health["busy"] and not health.get("queued")
        return 0 if ok else 1
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
