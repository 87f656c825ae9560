#!/bin/bash
# Rendered by sparkdeploy 0.1.0; do not edit (sparkdeploy render).
# Engine of node node1: rank 0 of 2 (head), release 12398b0b936a.
# Run by sparkdeploy-engine.service as /etc/sparkdeploy/current/launch.sh, in the foreground: systemd supervises
# `docker run` (no -d, no --rm, no docker restart policy), docker supervises vLLM (--init).
set -euo pipefail

# A container left by a crash or a reboot would block `docker run --name`.
docker rm -f sparkdeploy-engine >/dev/null 2>&1 || true

exec docker run \
  --name sparkdeploy-engine \
  --init \
  --stop-timeout 30 \
  --network host \
  --ipc host \
  --ulimit stack=67108864 \
  --shm-size 1g \
  --env-file /etc/sparkdeploy/current/engine.env \
  --env-file /etc/sparkdeploy/secrets.env \
  --label io.sparkdeploy.release=12398b0b936a \
  --label io.sparkdeploy.node=node1 \
  --label io.sparkdeploy.role=head \
  -v /var/lib/sparkdeploy/vocab:/opt/sparkdeploy/vocab:ro \
  -v /var/lib/sparkdeploy/capture:/var/lib/sparkdeploy/capture \
  -v /var/lib/sparkdeploy/cache/huggingface:/root/.cache/huggingface \
  -v /var/lib/sparkdeploy/cache/vllm:/root/.cache/vllm \
  -v /var/lib/sparkdeploy/cache/flashinfer:/root/.cache/flashinfer \
  -v /var/lib/sparkdeploy/cache/triton:/root/.triton \
  sparkdeploy/serving-sim:0.32.0-e082055cf270 \
  vllm serve /models/tiny-qwen3 \
  --served-model-name tiny \
  --host 0.0.0.0 \
  --port 8000 \
  --nnodes 2 \
  --node-rank 0 \
  --master-addr 172.30.97.11 \
  --master-port 29500 \
  --tensor-parallel-size 2 \
  --max-model-len 512 \
  --enforce-eager \
  --enable-prefix-caching \
  --speculative-config '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":3}' \
  --scheduler-cls spark_overlays.capture.scheduler \
  --additional-config '{"spark_overlays":{"capture":{"enabled":true,"flush_seconds":10,"path":"/var/lib/sparkdeploy/capture/counts.npy","switch":"/var/lib/sparkdeploy/capture/on"},"fp8_gdn":{"enabled":false},"prefix_align":{"enabled":false},"shortlist":{"enabled":false},"skinny_gemm":{"enabled":true}}}' \
  --enable-auto-tool-choice \
  --tool-call-parser hermes
