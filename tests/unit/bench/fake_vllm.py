"""A small stand-in for vLLM's OpenAI server: /v1/models, /version, /tokenize, streamed chat completions
and a /metrics page whose counters move like vLLM's. Knobs let a test restart it (counters re-created) or
finish a stray request in the middle of a run."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support.http_json import send_json

from .metrics_text import metrics_text


class FakeVllm:
    def __init__(self, *, accept_per_pos=(0.75, 0.5), tokens_per_chunk=2, block=16):
        self.lock = threading.Lock()
        self.accept_per_pos = accept_per_pos
        self.tokens_per_chunk = tokens_per_chunk
        self.block = block
        self.cached: set[str] = set()
        self.restart()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def restart(self) -> None:
        with getattr(self, "lock", threading.Lock()):
            self.c = dict(success=0, drafts=0, draft_tokens=0, accepted=0, per_pos=[0, 0], hits=0, queries=0,
                          gen_tokens=0, running=0, waiting=0, ttft_sum=0.0, ttft_count=0, decode_sum=0.0,
                          decode_count=0)
            self.created = time.time()  # also tells requests begun before the restart (a real one drops them)
            self.cached = set()
            self.linger_scrapes = 0

    def linger(self, scrapes: int) -> None:
        """Show one extra running request (not ours) for the next `scrapes` reads of /metrics."""
        with self.lock:
            self.linger_scrapes = scrapes

    def finish_stray(self, tokens: int = 10) -> None:
        """Account for a request that nobody in the test sent (someone else's traffic)."""
        with self.lock:
            self._account(tokens, 0, 0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def _account(self, tokens: int, queries: int, hits: int) -> None:
        c = self.c
        steps = max(1, tokens // 2)
        c["success"] += 1
        c["gen_tokens"] += tokens
        c["drafts"] += steps
        c["draft_tokens"] += 2 * steps
        acc = [round(steps * p) for p in self.accept_per_pos]
        c["per_pos"] = [a + b for a, b in zip(c["per_pos"], acc)]
        c["accepted"] += sum(acc)
        c["queries"] += queries
        c["hits"] += hits
        c["ttft_sum"] += 0.01
        c["ttft_count"] += 1
        c["decode_sum"] += 0.001 * tokens
        c["decode_count"] += 1

    def metrics(self) -> str:
        with self.lock:
            c = dict(self.c)
            if self.linger_scrapes > 0:
                self.linger_scrapes -= 1
                c["running"] += 1
        return metrics_text(success=c["success"], drafts=c["drafts"], draft_tokens=c["draft_tokens"],
                            accepted=c["accepted"], per_pos=c["per_pos"], hits=c["hits"], queries=c["queries"],
                            running=c["running"], waiting=c["waiting"], gen_tokens=c["gen_tokens"],
                            created=self.created, start=self.created, ttft_sum=c["ttft_sum"],
                            ttft_count=c["ttft_count"], decode_sum=c["decode_sum"], decode_count=c["decode_count"])

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # chunked streaming, as uvicorn serves vLLM's SSE

            def log_message(self, *args):
                pass

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def do_GET(self):
                if self.path == "/v1/models":
                    send_json(self, {"object": "list", "data": [{"id": "fake", "max_model_len": 4096}]})
                elif self.path == "/version":
                    send_json(self, {"version": "0.0.0-fake"})
                elif self.path == "/metrics":
                    data = fake.metrics().encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:
                    send_json(self, {"error": "not found"}, 404)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    send_json(self, {"count": len(body["prompt"].split())})
                    return
                if self.path == "/v1/completions":  # the kit's probes and golden prompts: greedy, not streamed
                    with fake.lock:
                        fake._account(body["max_tokens"], len(body["prompt"].split()), 0)
                    send_json(self, {"choices": [{"text": " tok" * body["max_tokens"]}]})
                    return
                if self.path != "/v1/chat/completions":
                    send_json(self, {"error": "not found"}, 404)
                    return
                text = "\n".join(m["content"] for m in body["messages"])
                words = text.split()
                blocks = [" ".join(words[: i + fake.block]) for i in range(0, len(words) - fake.block + 1, fake.block)]
                with fake.lock:
                    hits = sum(fake.block for b in blocks if b in fake.cached)
                    fake.cached.update(blocks)
                    fake.c["running"] += 1
                    began_in = fake.created
                n = body["max_tokens"]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                usage = lambda k: {"prompt_tokens": len(words), "completion_tokens": k}  # noqa: E731
                self._chunk(b"data: " + json.dumps({"choices": [{"delta": {"role": "assistant", "content": ""}}],
                                                    "usage": usage(0)}).encode() + b"\n\n")
                sent = 0
                while sent < n:
                    k = min(fake.tokens_per_chunk, n - sent)
                    sent += k
                    time.sleep(0.003)
                    chunk = {"choices": [{"delta": {"content": " tok" * k}}], "usage": usage(sent)}
                    self._chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                with fake.lock:
                    if fake.created == began_in:  # a restart meanwhile already zeroed the gauges
                        fake.c["running"] -= 1
                        fake._account(n, len(words), hits)
                self._chunk(b"data: " + json.dumps({"choices": [], "usage": usage(n)}).encode() + b"\n\n")
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

        return Handler
