#!/bin/bash
# Rendered by sparkdeploy 0.1.0; do not edit (sparkdeploy render).
# Engine of node spark1: rank 0 of 2 (head), release 18fa162d9e30.
# Run by sparkdeploy-engine.service as /etc/sparkdeploy/current/launch.sh, in the foreground: systemd supervises
# `docker run` (no -d, no --rm, no docker restart policy), docker supervises vLLM (--init).
set -euo pipefail

# A container left by a crash or a reboot would block `docker run --name`.
docker rm -f sparkdeploy-engine >/dev/null 2>&1 || true

# The shortlisted draft head reads this list; without it the engine would fail later and less clearly.
if [ ! -r /var/lib/sparkdeploy/vocab/current.txt ]; then
  echo "sparkdeploy: draft vocab "/var/lib/sparkdeploy/vocab/current.txt" is missing (run sparkdeploy up)" >&2
  exit 78
fi

# Drop the checkpoint's page cache: cached weights take memory the budget gave to vLLM.
python3 - /var/lib/sparkdeploy/models/qwen3.8-flash-next-nvfp4 <<'PY' || true
import os, sys
for root, _, files in os.walk(sys.argv[1]):
    for name in files:
        try:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
PY

exec docker run \
  --name sparkdeploy-engine \
  --init \
  --stop-timeout 30 \
  --network host \
  --ipc host \
  --gpus all \
  --device /dev/infiniband \
  --cap-add IPC_LOCK \
  --ulimit memlock=-1 \
  --ulimit stack=67108864 \
  --shm-size 16g \
  --env-file /etc/sparkdeploy/current/engine.env \
  --env-file /etc/sparkdeploy/secrets.env \
  --label io.sparkdeploy.release=18fa162d9e30 \
  --label io.sparkdeploy.node=spark1 \
  --label io.sparkdeploy.role=head \
  -v /var/lib/sparkdeploy/vocab:/opt/sparkdeploy/vocab:ro \
  -v /var/lib/sparkdeploy/capture:/var/lib/sparkdeploy/capture \
  -v /var/lib/sparkdeploy/cache/huggingface:/root/.cache/huggingface \
  -v /var/lib/sparkdeploy/cache/vllm:/root/.cache/vllm \
  -v /var/lib/sparkdeploy/cache/flashinfer:/root/.cache/flashinfer \
  -v /var/lib/sparkdeploy/cache/triton:/root/.triton \
  -v /var/lib/sparkdeploy/models/qwen3.8-flash-next-nvfp4:/models/qwen3.8-flash-next-nvfp4:ro \
  sparkdeploy/serving:0.34.0-1845509410be \
  vllm serve /models/qwen3.8-flash-next-nvfp4 \
  --served-model-name qwen3.8-flash-next \
  --host 0.0.0.0 \
  --port 8000 \
  --nnodes 2 \
  --node-rank 0 \
  --master-addr 192.168.177.11 \
  --master-port 29501 \
  --tensor-parallel-size 2 \
  --enable-expert-parallel \
  --max-model-len 131072 \
  --max-num-seqs 8 \
  --max-num-batched-tokens 4096 \
  --kv-cache-dtype fp8 \
  --gpu-memory-utilization 0.72 \
  --enable-prefix-caching \
  --speculative-config '{"method":"mtp","num_speculative_tokens":2,"use_local_argmax_reduction":true}' \
  --scheduler-cls spark_overlays.capture.scheduler \
  --additional-config '{"spark_overlays":{"capture":{"enabled":true,"flush_seconds":10,"path":"/var/lib/sparkdeploy/capture/counts.npy","switch":"/var/lib/sparkdeploy/capture/on"},"fp8_gdn":{"enabled":false},"prefix_align":{"enabled":false},"shortlist":{"enabled":true,"path":"/opt/sparkdeploy/vocab/current.txt","sha256":"1c901ae69c6132723fec50b0fb96630649b677b9f208881d35f26e6ebe878d60"},"skinny_gemm":{"enabled":false}}}' \
  --enable-auto-tool-choice \
  --tool-call-parser qwen3_coder \
  --reasoning-parser qwen3
