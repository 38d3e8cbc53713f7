#!/usr/bin/env bash
# The warm-pool bar (pooled session create -> first exec of `echo hello`, median
# at most 2 ms), taken apart on this machine, in one run, rounds alternated:
#   - brig serve and bench/http_floor.c (the least an HTTP server can do: a create
#     is a constant answer, an exec one posix_spawn of echo), each timed by two
#     clients keeping one connection: Python's http.client (bench/daemon_load.py,
#     as an SDK would be) and ureq (examples/daemon_latency.rs, which spends less
#     of each request in the client);
#   - GET /health on both after the same 0.3 s pauses: the HTTP stack alone;
#   - `echo hello` sent straight to a live session's init over its agent socket,
#     bypassing the daemon: the sandbox's own share of an exec;
#   - `/bin/echo hello` run bare on the host (hyperfine, with the LANG a sandbox
#     gets): the command's own cost.
#
#   bench/warm_pool.sh [ROUNDS]      (as root; installs hyperfine if missing;
#                                     default 3 rounds of 30 per measure)
#
# Writes bench/results/warm-pool.md.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
n=30
command -v hyperfine >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hyperfine >/dev/null
}
cargo build --release -q --bin brig --example daemon_latency
target="$PWD/target/$(rustc -vV | sed -n "s/^host: //p")/release"
brig="$target/brig"
lean="$target/examples/daemon_latency"
results="$PWD/bench/results"
mkdir -p "$results"
work=$(mktemp -d /tmp/brig-bench-warm.XXXXXX)
daemon_pid=""
floor_pid=""
session=""

cleanup() {
  set +e
  [ -n "$floor_pid" ] && kill "$floor_pid" 2>/dev/null
  # A live session outlives its daemon (by design): it is deleted first.
  [ -n "$session" ] && curl -sf -X DELETE -H "Authorization: Bearer $key" \
    "$url/v1/sessions/$session" >/dev/null
  if [ -n "$daemon_pid" ]; then
    kill "$daemon_pid" 2>/dev/null
    wait "$daemon_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cc -O2 -o "$work/http_floor" bench/http_floor.c
floor_url="http://127.0.0.1:$(free_port)"
"$work/http_floor" "${floor_url##*:}" >"$work/floor.log" 2>&1 &
floor_pid=$!
url="http://127.0.0.1:$(free_port)"
"$brig" serve --listen "${url#http://}" --data-dir "$work/data" --store "$work/store" \
  --default-image host --pool host=16 >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do
  curl -sf "$url/health" >/dev/null && curl -sf "$floor_url/health" >/dev/null && break
  sleep 0.05
done
key=$(cat "$work/data/admin.key")
# The session whose init the direct execs go to (deleted by cleanup).
session=$(curl -sf -X POST -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d '{}' "$url/v1/sessions" | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')
socket=$(ls "$work/data/sessions/$session"/agent-*.sock)
sleep 2

: >"$work/runs.jsonl"
measure() { # NAME COMMAND...
  local name=$1
  shift
  local out
  out=$("$@")
  echo "$name $out"
  python3 -c 'import json,sys; print(json.dumps({"name": sys.argv[1], **json.loads(sys.argv[2])}))' \
    "$name" "$out" >>"$work/runs.jsonl"
}
for round in $(seq "$rounds"); do
  echo "== round $round"
  measure "floor, ureq" "$lean" "$floor_url" - create $n pooled
  measure "brig, ureq" "$lean" "$url" "$key" create $n pooled
  measure "floor, python" python3 bench/daemon_load.py "$floor_url" - create $n pooled
  measure "brig, python" python3 bench/daemon_load.py "$url" "$key" create $n pooled
  measure "floor GET /health" "$lean" "$floor_url" - get $n /health
  measure "brig GET /health" "$lean" "$url" "$key" get $n /health
  measure "straight to init" "$lean" - - agent $n "$socket"
  LANG=C.UTF-8 hyperfine -N --warmup 20 --runs 300 --export-json "$work/echo.json" 'echo hello' >/dev/null
  measure "bare echo" python3 -c 'import json,sys; r = json.load(open(sys.argv[1]))["results"][0]
print(json.dumps({"n": len(r["times"]), "median_ms": round(r["median"] * 1000, 3)}))' "$work/echo.json"
done

python3 - "$work/runs.jsonl" "$results/warm-pool.md" "$rounds" <<'EOF'
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
names = list(dict.fromkeys(r["name"] for r in runs))
def cell(r):
    if "create_median_ms" in r:
        return f"{r['median_ms']} ({r['create_median_ms']} + {r['first_exec_median_ms']})"
    return f"{r['median_ms']}"
with open(sys.argv[2], "w") as out:
    out.write(f"Medians in ms of {runs[0]['n']} each, one request every 0.3 s, {sys.argv[3]} rounds "
              "alternated; for create -> first exec, the total (create + first exec).\n\n")
    out.write("| measure | " + " | ".join(f"round {i + 1}" for i in range(int(sys.argv[3]))) + " |\n")
    out.write("|---|" + "---|" * int(sys.argv[3]) + "\n")
    for name in names:
        label = {"floor, ureq": "create -> first exec: floor, ureq client",
                 "brig, ureq": "create -> first exec: brig, ureq client",
                 "floor, python": "create -> first exec: floor, Python client",
                 "brig, python": "create -> first exec: brig, Python client",
                 "straight to init": "exec `echo hello` straight to a session's init (no daemon)",
                 "bare echo": "`/bin/echo hello` on the host, no sandbox (hyperfine, back to back)"}.get(name, name)
        out.write(f"| {label} | " + " | ".join(cell(r) for r in runs if r["name"] == name) + " |\n")
EOF
cat "$results/warm-pool.md"
