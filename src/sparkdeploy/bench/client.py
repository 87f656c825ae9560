"""The OpenAI-compatible calls a benchmark makes: discover the service, send one streamed request and
timestamp every chunk.

Token timing comes from the stream itself: vLLM's `continuous_usage_stats` puts the running
completion-token count on every chunk, so a chunk that carries several tokens (speculative decoding
accepts several per step) is counted as such.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import requests

from sparkdeploy.errors import BenchError
from sparkdeploy.ops.health import bearer


@dataclass(frozen=True)
class Service:
    url: str  # OpenAI-compatible base, without /v1
    model: str
    vllm_version: str | None = None
    max_model_len: int | None = None
    api_key: str | None = field(default=None, repr=False)  # bearer token; never in results

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "api_key"}

    @property
    def headers(self) -> dict[str, str]:
        return bearer(self.api_key)


def normalize_url(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if "://" not in url:
        url = "http://" + url
    return url


def discover(url: str, *, model: str | None = None, timeout: float = 10.0, api_key: str | None = None) -> Service:
    """Model name from /v1/models (the first one unless `model` is given), version from /version."""
    base = normalize_url(url)
    try:
        resp = requests.get(base + "/v1/models", timeout=timeout, headers=bearer(api_key))
        if resp.status_code == 401:
            raise BenchError(f"{base}/v1/models: HTTP 401: the API wants a key (inventory auth.api_key_file, "
                             "or --api-key-file)")
        resp.raise_for_status()
        models = resp.json().get("data", [])
    except (requests.RequestException, ValueError) as err:
        raise BenchError(f"{base}/v1/models: cannot list models: {err}") from err
    if not models:
        raise BenchError(f"{base}/v1/models: the server lists no model")
    chosen = models[0]
    if model is not None:
        chosen = next((m for m in models if m.get("id") == model), None)
        if chosen is None:
            names = ", ".join(m.get("id", "?") for m in models)
            raise BenchError(f"{base}/v1/models: no model {model!r} (served: {names})")
    version = None
    try:
        v = requests.get(base + "/version", timeout=timeout)
        if v.ok:
            version = v.json().get("version")
    except (requests.RequestException, ValueError):
        pass
    return Service(base, chosen["id"], version, chosen.get("max_model_len"), api_key)


@dataclass
class RequestResult:
    """What one streamed request showed the client."""

    ok: bool
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    ttft_s: float | None = None  # send -> first chunk carrying output
    decode_s: float | None = None  # first output chunk -> last output chunk
    total_s: float | None = None
    text: str = ""
    chunk_times: list[float] = field(default_factory=list, repr=False)  # seconds since send
    chunk_tokens: list[int] = field(default_factory=list, repr=False)  # cumulative tokens at each chunk

    @property
    def bunched(self) -> bool:
        """True when more than half of the tokens reached the client within a tenth of the stream's duration
        (client or API server starved of CPU, or a buffering proxy): the stream's timing then says nothing
        about decode speed. A healthy stream spreads its tokens evenly, a few per chunk."""
        n = self.completion_tokens
        if n < 8 or not self.chunk_times or not self.total_s:
            return False
        window = max(0.002, 0.1 * self.chunk_times[-1])
        got = [c - p for c, p in zip(self.chunk_tokens, [0] + self.chunk_tokens[:-1])]
        i = running = best = 0
        for j, t in enumerate(self.chunk_times):
            running += got[j]
            while self.chunk_times[i] < t - window:
                running -= got[i]
                i += 1
            best = max(best, running)
        return best > n / 2

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first one over the time after the first one (the prefill is TTFT's); None when
        the stream arrived bunched."""
        if not self.decode_s or self.decode_s <= 0 or not self.chunk_tokens or self.bunched:
            return None
        return (self.completion_tokens - self.chunk_tokens[0]) / self.decode_s

    def to_dict(self) -> dict:
        return {
            "ok": self.ok, "error": self.error, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "ttft_s": self.ttft_s, "decode_s": self.decode_s,
            "total_s": self.total_s, "decode_tok_s": self.decode_tok_s, "bunched": self.bunched,
            "chunks": len(self.chunk_times),
        }


def chat_body(service: Service, messages: list[dict], max_tokens: int, *, ignore_eos: bool = True) -> dict:
    return {
        "model": service.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": ignore_eos,  # vLLM extension: a fixed token count makes runs comparable
    }


def stream_chat(service: Service, messages: list[dict], max_tokens: int, *, ignore_eos: bool = True,
                timeout: float = 600.0, session: requests.Session | None = None) -> RequestResult:
    """Send one streamed chat completion at temperature 0 and timestamp its chunks."""
    body = chat_body(service, messages, max_tokens, ignore_eos=ignore_eos)
    url = service.url + "/v1/chat/completions"
    result = RequestResult(ok=False)
    t0 = time.perf_counter()
    chunks_seen = 0
    try:
        with (session or requests).post(url, json=body, stream=True, timeout=timeout,
                                        headers=service.headers) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                return result
            for raw in resp.iter_lines(chunk_size=None):
                if not raw or not raw.startswith(b"data:"):
                    continue
                data = raw[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.perf_counter() - t0
                event = json.loads(data)
                usage = event.get("usage") or {}
                if usage.get("prompt_tokens") is not None:
                    result.prompt_tokens = usage["prompt_tokens"]
                choices = event.get("choices") or []
                delta_text = "".join((c.get("delta") or {}).get("content") or "" for c in choices)
                count = usage.get("completion_tokens")
                if count is None and delta_text:
                    chunks_seen += 1
                    count = chunks_seen  # no usage on chunks: one token per content chunk, a lower bound
                if count is not None and count > result.completion_tokens:
                    result.chunk_times.append(now)
                    result.chunk_tokens.append(count)
                    result.completion_tokens = count
                result.text += delta_text
    except (requests.RequestException, ValueError) as err:
        result.error = f"{url}: {err}"
        return result
    result.total_s = time.perf_counter() - t0
    if result.chunk_times:
        result.ttft_s = result.chunk_times[0]
        result.decode_s = result.chunk_times[-1] - result.chunk_times[0]
    result.ok = result.completion_tokens > 0
    if not result.ok:
        result.error = "the stream carried no output tokens"
    return result


def count_tokens(service: Service, text: str, *, timeout: float = 30.0) -> int | None:
    """Token count of `text` from vLLM's /tokenize, or None when the server has no such route."""
    try:
        resp = requests.post(service.url + "/tokenize", json={"model": service.model, "prompt": text},
                             timeout=timeout)
        if resp.ok:
            return int(resp.json()["count"])
    except (requests.RequestException, ValueError, KeyError):
        pass
    return None
