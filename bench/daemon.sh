#!/usr/bin/env bash
# `brig serve` measured next to gVisor (runsc), in one run on this machine:
#   1. exec round trip of `echo hello` in a live sandbox: brig over HTTP vs
#      `runsc exec` into a running gVisor container (both as CLI processes, with
#      hyperfine), plus brig's round trip from a client keeping its connection open;
#   2. session create -> first exec: cold, and from the warm pool;
#   3. 1,000 idle sessions: memory per session (MemAvailable drop / N, init PSS);
#   4. exec latency p50/p95 while 100 sessions run execs concurrently.
# The round trip and create -> first exec are also measured against
# bench/http_floor.c, a server that answers the same requests with the least work
# (no sandbox, no state; an exec is one posix_spawn of echo): the machine's floor.
#
#   bench/daemon.sh            (as root; installs hyperfine and runsc if missing)
#
# Writes bench/results/daemon.md (and daemon-*.json).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v hyperfine >/dev/null || need+=(hyperfine)
command -v runsc >/dev/null || need+=(runsc)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
cargo build --release -q
brig="$PWD/target/$(rustc -vV | sed -n "s/^host: //p")/release/brig"
results="$PWD/bench/results"
mkdir -p "$results"
work=$(mktemp -d /tmp/brig-bench-daemon.XXXXXX)
daemon_pid=""
floor_pid=""
runsc_root="$work/runsc"

cleanup() {
  set +e
  [ -n "$floor_pid" ] && kill "$floor_pid" 2>/dev/null
  if [ -n "$daemon_pid" ]; then
    # Sessions outlive the daemon by design: delete them through the API first.
    for s in $(curl -s -H "Authorization: Bearer $(cat "$work/data/admin.key" 2>/dev/null)" \
      "$url/v1/sessions" | python3 -c 'import json,sys; print(" ".join(s["session_id"] for s in json.load(sys.stdin).get("sessions", [])))' 2>/dev/null); do
      curl -s -X DELETE -H "Authorization: Bearer $(cat "$work/data/admin.key")" "$url/v1/sessions/$s" >/dev/null
    done
    kill "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null
  fi
  runsc --root "$runsc_root" kill brigbench KILL >/dev/null 2>&1
  sleep 0.5
  runsc --root "$runsc_root" delete -force brigbench >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url="http://127.0.0.1:$port"

start_daemon() {
  "$brig" serve --listen "127.0.0.1:$port" --data-dir "$work/data" --store "$work/store" \
    --default-image host "$@" >"$work/daemon.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 100); do curl -sf "$url/health" >/dev/null && break; sleep 0.05; done
  key=$(cat "$work/data/admin.key")
  # Room for the idle and concurrency runs (a tenant's defaults are 100 sessions, 16 execs).
  curl -sf -X PUT -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d '{"max_sessions": 5000, "max_concurrent_execs": 1000, "max_disk_bytes": "1000T"}' \
    "$url/v1/tenants/admin/quotas" >/dev/null
}

stop_daemon() {
  kill "$daemon_pid"; wait "$daemon_pid" || true; daemon_pid=""
}

cc -O2 -o "$work/http_floor" bench/http_floor.c
floor_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
floor_url="http://127.0.0.1:$floor_port"
"$work/http_floor" "$floor_port" >"$work/floor.log" 2>&1 &
floor_pid=$!
for _ in $(seq 100); do curl -sf "$floor_url/health" >/dev/null && break; sleep 0.05; done

# gVisor: a container running `sleep` from a minimal root (dash, coreutils, their libraries).
bundle="$work/bundle"
mkdir -p "$bundle/rootfs/bin" "$runsc_root"
for tool in sh echo sleep true cat; do
  src=$(readlink -f "$(type -P $tool)")
  cp "$src" "$bundle/rootfs/bin/$tool"
  for lib in $(ldd "$src" | grep -o '/[^ ]*'); do
    mkdir -p "$bundle/rootfs$(dirname "$lib")"; cp -n "$lib" "$bundle/rootfs$lib"
  done
done
(cd "$bundle" && runsc spec -- /bin/sleep infinity)
python3 - "$bundle/config.json" <<'EOF'
import json, sys
path = sys.argv[1]
spec = json.load(open(path))
spec["process"]["terminal"] = False
spec["root"]["readonly"] = True
json.dump(spec, open(path, "w"), indent=2)
EOF
runsc --root "$runsc_root" --platform=ptrace --network=none run -detach --bundle "$bundle" brigbench
runsc --root "$runsc_root" exec brigbench /bin/echo hello >/dev/null

start_daemon
session=$(curl -sf -X POST -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d '{}' "$url/v1/sessions" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')

echo "== exec round trip: processes (hyperfine)"
hyperfine -N --warmup 10 --runs 100 --export-json "$results/daemon-exec.json" \
  -n 'runsc exec (gVisor, ptrace)' "runsc --root $runsc_root exec brigbench /bin/echo hello" \
  -n 'curl -> brig serve exec' "curl -sf -X POST -H 'Authorization: Bearer $key' -H 'Content-Type: application/json' -d '{\"argv\":[\"echo\",\"hello\"]}' $url/v1/sessions/$session/exec" \
  -n 'brig exec (CLI, SSE)' "$brig exec --url $url --api-key $key $session -- echo hello"
curl -sf -X DELETE -H "Authorization: Bearer $key" "$url/v1/sessions/$session" >/dev/null

echo "== exec round trip: one client, keep-alive"
rtt=$(python3 bench/daemon_load.py "$url" "$key" rtt 1000); echo "$rtt"
floor_rtt=$(python3 bench/daemon_load.py "$floor_url" - rtt 1000); echo "floor: $floor_rtt"
echo "== create -> first exec, cold"
cold=$(python3 bench/daemon_load.py "$url" "$key" create 100); echo "$cold"
echo "== 100 sessions running execs concurrently for 20 s"
conc=$(python3 bench/daemon_load.py "$url" "$key" concurrent 100 20); echo "$conc"
echo "== 1000 idle sessions"
idle=$(python3 bench/daemon_load.py "$url" "$key" idle 1000 "$daemon_pid"); echo "$idle"
stop_daemon

# A pool of 96: the idle pattern takes one at a time, the busy one 40 back to back
# (the daemon refills during a burst only once less than half the pool is left).
start_daemon --pool host=96
sleep 2
echo "== create -> first exec, warm pool"
warm=$(python3 bench/daemon_load.py "$url" "$key" create 100 pooled); echo "$warm"
echo "== create -> first exec, warm pool, back to back"
busy=$(python3 bench/daemon_load.py "$url" "$key" create 40 busy); echo "$busy"
stop_daemon
# Next, not interleaved: the daemon refills its pool after each pattern, which
# would run beside the floor's requests.
echo "== the same two patterns against the floor server"
floor_warm=$(python3 bench/daemon_load.py "$floor_url" - create 100 pooled); echo "floor: $floor_warm"
floor_busy=$(python3 bench/daemon_load.py "$floor_url" - create 40 busy); echo "floor: $floor_busy"
kill "$floor_pid"; floor_pid=""

python3 - "$results" <<EOF
import json, sys
results = sys.argv[1]
rtt, cold, warm, busy, conc, idle = ($rtt), ($cold), ($warm), ($busy), ($conc), ($idle)
floor = {"rtt": ($floor_rtt), "warm": ($floor_warm), "busy": ($floor_busy)}
json.dump({"rtt": rtt, "cold": cold, "warm": warm, "busy": busy, "concurrent": conc, "idle": idle,
           "floor": floor},
          open(f"{results}/daemon-load.json", "w"), indent=2)
exec_runs = json.load(open(f"{results}/daemon-exec.json"))["results"]
with open(f"{results}/daemon.md", "w") as out:
    out.write("### Exec round trip, as CLI processes (hyperfine, 100 runs)\n\n")
    out.write("| command | median ms | mean ms | min ms | max ms |\n|---|---|---|---|---|\n")
    for r in exec_runs:
        ms = lambda v: f"{v * 1000:.2f}"
        out.write(f"| {r['command']} | {ms(r['median'])} | {ms(r['mean'])} | {ms(r['min'])} | {ms(r['max'])} |\n")
    out.write("\n### brig serve, one client keeping its connection open\n\n")
    out.write("| measure | n | median ms | p95 ms | p99 ms |\n|---|---|---|---|---|\n")
    for name, r in [("exec echo hello, live session", rtt),
                    ("create -> first exec, cold", cold),
                    (f"create -> first exec, warm pool, 0.3 s apart ({warm['pooled']}/{warm['n']} pooled)", warm),
                    (f"create -> first exec, warm pool, back to back ({busy['pooled']}/{busy['n']} pooled)", busy),
                    (f"exec under load: {conc['sessions']} sessions concurrently, {conc['execs_per_s']} execs/s, {conc['errors']} errors", conc)]:
        out.write(f"| {name} | {r['n']} | {r['median_ms']} | {r['p95_ms']} | {r['p99_ms']} |\n")
    out.write("\nOf create -> first exec (medians, ms): ")
    out.write("; ".join(f"{name}: create {r['create_median_ms']}, first exec {r['first_exec_median_ms']}"
                        for name, r in [("cold", cold), ("warm, 0.3 s apart", warm), ("warm, back to back", busy)]))
    out.write(".\n")
    out.write("\n### The machine's floor: the same client against bench/http_floor.c (no sandbox, no state)\n\n")
    out.write("| measure | n | floor median ms | brig median ms | floor p95 ms | create / first exec, floor (ms) |\n")
    out.write("|---|---|---|---|---|---|\n")
    for name, f, b in [("exec echo hello, live session", floor["rtt"], rtt),
                       ("create -> first exec, 0.3 s apart", floor["warm"], warm),
                       ("create -> first exec, back to back", floor["busy"], busy)]:
        split = f"{f['create_median_ms']} / {f['first_exec_median_ms']}" if "create_median_ms" in f else ""
        out.write(f"| {name} | {f['n']} | {f['median_ms']} | {b['median_ms']} | {f['p95_ms']} | {split} |\n")
    out.write("\n### 1,000 idle sessions\n\n")
    for k, v in idle.items():
        out.write(f"- {k}: {v}\n")
EOF
echo "results in bench/results/daemon.md"
