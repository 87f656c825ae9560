#!/usr/bin/env bash
# Regenerate the example report in this folder from a running service.
#
#   URL=http://HEAD:8000 [URL_B=http://...] [NOTE="measured on ..."] [PREFIX=9500,30000] docs/bench-example/run.sh
#
# URL is configuration A. probe runs twice on A (the repeat shows what "within noise" looks like); with URL_B
# (configuration B, e.g. the same model without speculation) a probe on B is compared against A as well.
# Scale PREFIX to the server's max_model_len (the tiny CPU model here: 1500,6000 at --max-model-len 8192).
set -euo pipefail
: "${URL:?set URL to the OpenAI-compatible base of the service}"
OUT=$(cd "$(dirname "$0")" && pwd)
R="$OUT/results"
mkdir -p "$R"
SD=(python3 -m sparkdeploy bench)
PROBE=(--category code --category prose_en --category prose_zh --tokens "${TOKENS:-256}" --runs 3 --warmup 1)

"${SD[@]}" probe --url "$URL" "${PROBE[@]}" --out "$R/probe-a.json"
"${SD[@]}" harness --url "$URL" --tokens "${HARNESS_TOKENS:-256}" --concurrency 1,2,4,8 --out "$R/harness-a.json"
"${SD[@]}" turn2 --url "$URL" --prefix-tokens "${PREFIX:-9500,30000}" --out "$R/turn2-a.json"
"${SD[@]}" probe --url "$URL" "${PROBE[@]}" --out "$R/probe-a-repeat.json"
PAIRS=(--pair "$R/probe-a.json,$R/probe-a-repeat.json")
FILES=("$R/harness-a.json" "$R/turn2-a.json" "$R/probe-a.json")
if [ -n "${URL_B:-}" ]; then
  "${SD[@]}" probe --url "$URL_B" "${PROBE[@]}" --out "$R/probe-b.json"
  PAIRS+=(--pair "$R/probe-a.json,$R/probe-b.json" --pair "$R/probe-a.json,$R/probe-b.json,$R/probe-a-repeat.json")
  FILES+=("$R/probe-b.json")
fi
"${SD[@]}" report "${FILES[@]}" "${PAIRS[@]}" --out "$OUT" \
  --title "sparkdeploy bench: example report" --note "${NOTE:-measured on an unnamed service}"
