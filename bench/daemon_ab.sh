#!/usr/bin/env bash
# Two builds of `brig serve` side by side, in one run: the daemon measures of
# bench/daemon.sh (exec round trip, create -> first exec cold and from the pool,
# memory per idle session, execs from 100 concurrent sessions), taken for both
# daemons in alternating rounds so that both see the same machine, then medians.
# For "no regression" checks of a change: A is the build before it, B after.
#
#   bench/daemon_ab.sh A_BRIG B_BRIG [ROUNDS]     (as root)
#   INTERLEAVED=create|idle bench/daemon_ab.sh A_BRIG B_BRIG [BATCHES]
#
# The second form runs both daemons at once and alternates one measure between
# them batch by batch (create: 40 cold creates; idle: 300 idle sessions), for when
# the rounds of the first disagree more than the builds do.
#
# Build A in a worktree of the earlier commit (`cargo build --release`; the binary
# is target/<host triple>/release/brig). Writes bench/results/daemon-ab.md.
set -euo pipefail
cd "$(dirname "$0")/.."
a_brig=$(readlink -f "$1")
b_brig=$(readlink -f "$2")
rounds=${3:-3}
results="$PWD/bench/results"
mkdir -p "$results"
work=$(mktemp -d /tmp/brig-bench-ab.XXXXXX)
declare -A pid url key

cleanup() {
  set +e
  for side in a b; do
    [ -n "${pid[$side]:-}" ] || continue
    # Sessions outlive the daemon by design: delete them through the API first.
    for s in $(curl -s -H "Authorization: Bearer ${key[$side]}" "${url[$side]}/v1/sessions" \
      | python3 -c 'import json,sys; print(" ".join(s["session_id"] for s in json.load(sys.stdin).get("sessions", [])))' 2>/dev/null); do
      curl -s -X DELETE -H "Authorization: Bearer ${key[$side]}" "${url[$side]}/v1/sessions/$s" >/dev/null
    done
    kill "${pid[$side]}" 2>/dev/null; wait "${pid[$side]}" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start SIDE BINARY [FLAGS...]: a daemon with its own data dir and image store.
start() {
  local side=$1 bin=$2; shift 2
  local port; port=$(free_port)
  url[$side]="http://127.0.0.1:$port"
  "$bin" serve --listen "127.0.0.1:$port" --data-dir "$work/$side/data" --store "$work/$side/store" \
    --default-image host "$@" >"$work/$side.log" 2>&1 &
  pid[$side]=$!
  for _ in $(seq 200); do curl -sf "${url[$side]}/health" >/dev/null && break; sleep 0.05; done
  key[$side]=$(cat "$work/$side/data/admin.key")
  curl -sf -X PUT -H "Authorization: Bearer ${key[$side]}" -H 'Content-Type: application/json' \
    -d '{"max_sessions": 5000, "max_concurrent_execs": 1000, "max_disk_bytes": "1000T"}' \
    "${url[$side]}/v1/tenants/admin/quotas" >/dev/null
}

stop() {
  kill "${pid[$1]}"; wait "${pid[$1]}" || true; pid[$1]=""
}

load() {
  local side=$1; shift
  python3 bench/daemon_load.py "${url[$side]}" "${key[$side]}" "$@"
}

out="$work/samples.jsonl"

if [ -n "${INTERLEAVED:-}" ]; then
  start a "$a_brig"
  start b "$b_brig"
  for batch in $(seq "$rounds"); do
    for side in a b; do
      case $INTERLEAVED in
        create) echo "$side create $(load "$side" create 40)" ;;
        idle) echo "$side idle $(load "$side" idle 300 "${pid[$side]}")" ;;
        *) echo "INTERLEAVED is create or idle" >&2; exit 2 ;;
      esac
    done
  done
  exit 0
fi
record() {
  # record SIDE MEASURE JSON
  python3 -c 'import json,sys; print(json.dumps({"side": sys.argv[1], "measure": sys.argv[2], "result": json.loads(sys.argv[3])}))' \
    "$1" "$2" "$3" >>"$out"
  echo "$1 $2: $3"
}

for round in $(seq "$rounds"); do
  echo "== round $round"
  # Alternate which side goes first, so neither always runs on a warmer machine.
  if [ $((round % 2)) -eq 1 ]; then order="a b"; else order="b a"; fi
  for side in $order; do
    bin=$a_brig; [ "$side" = b ] && bin=$b_brig
    start "$side" "$bin"
    record "$side" rtt "$(load "$side" rtt 500)"
    record "$side" cold "$(load "$side" create 50)"
    record "$side" concurrent "$(load "$side" concurrent 100 10)"
    record "$side" idle "$(load "$side" idle 300 "${pid[$side]}")"
    stop "$side"
    start "$side" "$bin" --pool host=64
    sleep 2
    record "$side" pooled "$(load "$side" create 50 pooled)"
    stop "$side"
  done
done

python3 - "$out" "$results/daemon-ab.md" "$a_brig" "$b_brig" "$rounds" <<'EOF'
import json, statistics, sys
samples, target, a, b, rounds = sys.argv[1:]
rows = [json.loads(line) for line in open(samples)]
def pick(side, measure):
    return [r["result"] for r in rows if r["side"] == side and r["measure"] == measure]
def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
lines = [f"# brig serve, A/B ({rounds} alternating rounds, medians of the rounds)", "",
         f"- A: `{a}`", f"- B: `{b}`", "",
         "| measure | A | B | B/A |", "|---|---|---|---|"]
def row(name, measure, key, unit):
    va = med([r.get(key) for r in pick("a", measure)])
    vb = med([r.get(key) for r in pick("b", measure)])
    ratio = f"{vb / va:.2f}" if va and vb else "-"
    fmt = lambda v: "-" if v is None else f"{v:.3g} {unit}"
    lines.append(f"| {name} | {fmt(va)} | {fmt(vb)} | {ratio} |")
row("exec round trip, median", "rtt", "median_ms", "ms")
row("exec round trip, p95", "rtt", "p95_ms", "ms")
row("create -> first exec, cold, median", "cold", "median_ms", "ms")
row("create -> first exec, pooled, median", "pooled", "median_ms", "ms")
row("100 concurrent sessions: exec median", "concurrent", "median_ms", "ms")
row("100 concurrent sessions: exec p95", "concurrent", "p95_ms", "ms")
row("100 concurrent sessions: execs/s", "concurrent", "execs_per_s", "/s")
row("100 concurrent sessions: errors", "concurrent", "errors", "")
row("idle session: MemAvailable drop", "idle", "per_session_kib_memavailable", "KiB")
row("idle session: init PSS", "idle", "init_pss_kib_median", "KiB")
row("300 idle sessions: daemon PSS growth", "idle", "daemon_pss_growth_kib", "KiB")
lines += ["", "Raw rounds:", "", "```"] + [json.dumps(r) for r in rows] + ["```"]
open(target, "w").write("\n".join(lines) + "\n")
print("\n".join(lines[:16]))
EOF
