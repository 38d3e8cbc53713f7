#!/usr/bin/env bash
# Start-up cost of brig next to bubblewrap and the bare command, measured side by side
# in one hyperfine run, plus brig's own per-stage breakdown (timings_us).
#
#   bench/startup.sh [RUNS]        (as root; installs hyperfine and bubblewrap if missing)
#
# Writes bench/results/startup.md and startup.json, and prints the stage medians.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-300}"
need=()
command -v hyperfine >/dev/null || need+=(hyperfine)
command -v bwrap >/dev/null || need+=(bubblewrap)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
cargo build --release -q
brig="./target/$(rustc -vV | sed -n "s/^host: //p")/release/brig"
bwrap="bwrap --unshare-all --die-with-parent --ro-bind / / --proc /proc --dev /dev --tmpfs /tmp"
mkdir -p bench/results

hyperfine -N --warmup 30 --runs "$runs" \
  --export-markdown bench/results/startup.md --export-json bench/results/startup.json \
  -n 'bare /bin/true' '/bin/true' \
  -n 'bwrap /bin/true' "$bwrap /bin/true" \
  -n 'brig /bin/true' "$brig run -- /bin/true" \
  -n 'bare python3 -c pass' '/usr/bin/python3 -c pass' \
  -n 'bwrap python3 -c pass' "$bwrap /usr/bin/python3 -c pass" \
  -n 'brig python3 -c pass' "$brig run -- /usr/bin/python3 -c pass"

echo
echo "brig start-up stages (median of $runs runs, microseconds since brig began the run):"
for _ in $(seq "$runs"); do "$brig" run --json -- /bin/true; done | python3 -c '
import json, statistics, sys
stages = {}
order = []
for line in sys.stdin:
    for t in json.loads(line)["timings_us"]:
        if t["stage"] not in stages:
            order.append(t["stage"])
        stages.setdefault(t["stage"], []).append(t["at_us"])
prev = 0
# Parent and child stages interleave: list them in the order they happen.
order.sort(key=lambda name: statistics.median(stages[name]))
for name in order:
    med = statistics.median(stages[name])
    print(f"  {name:26s} at {med:8.0f} us  (+{med - prev:6.0f})")
    prev = med
'
