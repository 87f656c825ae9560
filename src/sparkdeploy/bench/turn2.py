"""`bench turn2`: turn one of a conversation with a long prefix, then turn two (same prefix, the answer, a
follow-up). Records both TTFTs and the prefix-cache hits of each turn from `vllm:prefix_cache_hits_total`
deltas. The seed's broken case: turn two 3.30 s with 0 hits; fixed: 0.23 s with 9,464 hits.

Every run starts its prefix with a fresh nonce, so turn one is always cold and turn two's hits can only
come from turn one.
"""

from __future__ import annotations

import random
import uuid

from sparkdeploy.bench import results
from sparkdeploy.bench.client import Service, count_tokens, stream_chat
from sparkdeploy.bench.probe import Progress, measured_run_for
from sparkdeploy.errors import BenchError

QUESTION = "\n\nUsing the notes above, summarise the three most important points in one sentence each."
FOLLOW_UP = "Now give one concrete next step for the second point."
_WORDS = ("engine node cache prefix block token decode draft verify kernel memory budget restart health "
          "metric latency throughput rank tensor expert router vocabulary shortlist release image overlay "
          "patch inventory plan render step fact network interface gloo nccl socket port timeout backoff "
          "median noise repeat baseline verdict warm steady request stream batch chunk align state").split()


def make_prefix(n_tokens: int, nonce: str, count=None, seed: int = 0) -> str:
    """Plain notes text of about n_tokens tokens, starting with `nonce` (calibrated with `count` if given)."""
    rng = random.Random(f"{seed}:{nonce}")

    def text(words: int) -> str:
        lines, out = [], []
        for i in range(words):
            out.append(rng.choice(_WORDS))
            if len(out) == 12:
                lines.append(f"{len(lines) + 1}. " + " ".join(out) + ".")
                out = []
        if out:
            lines.append(f"{len(lines) + 1}. " + " ".join(out) + ".")
        return f"Notes {nonce}:\n" + "\n".join(lines)

    words = max(1, int(n_tokens * 0.7))
    body = text(words)
    if count is not None:
        for _ in range(3):
            got = count(body)
            if not got or abs(got - n_tokens) <= max(8, n_tokens // 50):
                break
            words = max(1, int(words * n_tokens / got))
            rng.seed(f"{seed}:{nonce}")
            body = text(words)
    return body


def turn2(service: Service, prefix_tokens: list[int], *, tokens: int = 32, runs: int = 3, warmup: int = 1,
          context: dict | None = None, progress: Progress | None = None) -> dict:
    settings = {"prefix_tokens": list(prefix_tokens), "tokens": tokens, "runs": runs, "warmup": warmup,
                "temperature": 0}
    if service.max_model_len:
        too_long = [p for p in prefix_tokens if p + 2 * tokens + 64 > service.max_model_len]
        if too_long:
            raise BenchError(f"--prefix-tokens {too_long[0]}: does not fit the server's max_model_len "
                             f"{service.max_model_len} with two turns of {tokens} tokens")
    result = results.new("turn2", service.to_dict(), context or {}, settings)

    def count(text: str) -> int | None:
        return count_tokens(service, text)

    for p in prefix_tokens:
        group = f"prefix{p}"
        kept, discarded, attempt = 0, 0, 0
        while kept < runs and discarded <= runs:
            is_warmup = attempt < warmup
            nonce = uuid.uuid4().hex[:12]
            prefix = make_prefix(p, nonce, count)
            first = [{"role": "user", "content": prefix + QUESTION}]
            one = measured_run_for(result, [lambda: stream_chat(service, first, tokens)], None, group, attempt)
            two = None
            if one.kept:
                second = first + [{"role": "assistant", "content": one.requests[0].text},
                                  {"role": "user", "content": FOLLOW_UP}]
                two = measured_run_for(result, [lambda: stream_chat(service, second, tokens)], None, group,
                                       attempt)
            record_outcome = two if (two is not None and not two.kept) else one
            if one.kept and two is not None and two.kept:
                hits1 = one.delta.prefix_cache()["hits"]
                pc2 = two.delta.prefix_cache()
                values = {
                    "ttft_turn1_s": one.requests[0].ttft_s,
                    "ttft_turn2_s": two.requests[0].ttft_s,
                    "prefix_hits_turn1": hits1,
                    "prefix_hits_turn2": pc2["hits"],
                    "prompt_tokens": two.requests[0].prompt_tokens,
                }
                if pc2["hit_rate"] is not None:
                    values["prefix_hit_rate_turn2"] = pc2["hit_rate"]
                record_outcome = two
                record_outcome.requests = one.requests + two.requests
            else:
                values = {}
                if two is not None:
                    two.requests = one.requests + two.requests
            index = attempt - warmup if is_warmup else kept
            rec = results.add_run(result, group, index, is_warmup, record_outcome, values=values,
                                  extra={"turn1_prompt_tokens": one.requests[0].prompt_tokens})
            attempt += 1
            if not is_warmup:
                if rec["kept"]:
                    kept += 1
                else:
                    discarded += 1
            if progress:
                if rec["kept"]:
                    progress(f"{group}: {'warm-up' if is_warmup else 'run'} kept: turn1 TTFT "
                             f"{values['ttft_turn1_s']:.3f} s ({values['prefix_hits_turn1']:g} hits), turn2 TTFT "
                             f"{values['ttft_turn2_s']:.3f} s ({values['prefix_hits_turn2']:g} hits)")
                else:
                    progress(f"{group}: run DISCARDED: {rec['discard_reason']}")
    results.summarize_runs(result)
    return result
