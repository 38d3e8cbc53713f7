#!/usr/bin/env bash
# The whole test suite, as CI runs it. Installs what the tests need on a fresh
# Debian machine (which has only the Rust toolchain, gcc, Python and git), then runs
# formatting, lints and every test. Tests that need root say so and skip without it.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use inside sandboxes and around them:
#   python3        /usr/bin/python3 inside the sandbox (the host's /usr is its /usr)
#   python3-matplotlib, python3-pandas
#                  the interpreter's charts and tables (tests/api/interpreter.rs)
#   python3-openpyxl
#                  onyx's Excel test (tests/onyx.rs runs onyx's tests in the host image)
#   procps         ps, used by isolation tests
#   util-linux     setpriv (rootless test), unshare, ipcmk/ipcs, setsid
#   passwd         useradd/userdel for the rootless test's own user
#   erofs-utils    mkfs.erofs: brig packs image layers with it
#   e2fsprogs      mkfs.ext4: the daemon's volumes are ext4 images
#   debootstrap    the `python` image recipe's Debian base
#   nftables       nft: egress's transparent capture, inside each sandbox's namespace
#   iproute2       ip: the same (a local route for the synthetic addresses)
need=()
command -v /usr/bin/python3 >/dev/null 2>&1 || need+=(python3)
/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1 || need+=(python3-matplotlib)
/usr/bin/python3 -c 'import pandas' >/dev/null 2>&1 || need+=(python3-pandas)
/usr/bin/python3 -c 'import openpyxl' >/dev/null 2>&1 || need+=(python3-openpyxl)
command -v ps >/dev/null 2>&1 || need+=(procps)
command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
command -v ipcmk >/dev/null 2>&1 || need+=(util-linux)
command -v useradd >/dev/null 2>&1 || need+=(passwd)
command -v mkfs.erofs >/dev/null 2>&1 || need+=(erofs-utils)
[ -x /usr/sbin/mkfs.ext4 ] || [ -x /sbin/mkfs.ext4 ] || need+=(e2fsprogs)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
[ -x /usr/sbin/nft ] || [ -x /sbin/nft ] || need+=(nftables)
[ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || [ -x /usr/bin/ip ] || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing Debian packages: ${need[*]} (run as root to install them)" >&2
    exit 1
  fi
fi

# PyPI, in a virtualenv of the build's own: openapi-spec-validator checks the
# daemon's OpenAPI document, and its jsonschema checks live exchanges against it
# (tests/openapi_conformance.py); mcp, the official MCP client, drives brig's MCP
# server (tests/mcp_client.py); the Python SDK (editable, with its httpx) and
# pytest run its suite against a live daemon (tests/sdk_python.rs), and onyx's
# code-interpreter tests and its client (httpx, pytest, requests, pydantic) against
# one (tests/onyx.rs).
validator=target/test-venv/bin/openapi-spec-validator
pypi=(openapi-spec-validator==0.9.0 mcp==2.3.0 httpx==0.28.1 pytest==8.3.4 pytest-asyncio==0.25.3 requests==2.33.0 pydantic==2.14.4 e2b==2.63.0 e2b-code-interpreter==2.11.5)
if [ ! -x "$validator" ]; then
  rm -rf target/test-venv
  if ! python3 -m venv target/test-venv; then
    # Debian's own python3 keeps venv in a package of its own.
    rm -rf target/test-venv
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv target/test-venv
  fi
fi
# Each run: a venv made before a package was added to the list gets it.
target/test-venv/bin/pip install -q --disable-pip-version-check "${pypi[@]}" -e sdk/python

# What brig may leave behind if a cleanup path is broken: cgroup leaves, processes,
# mounts. Recorded before and compared after the whole suite (each test also checks
# its own runs).
leftovers() {
  { find /sys/fs/cgroup -name 'brig-*' -type d 2>/dev/null
    ps -eo pid=,comm= | awk '$2 ~ /^brig/ {print "process", $0}'
    { grep brig /proc/self/mountinfo || true; } | sed 's/^/mount /'
    # Layer mounts and loop devices of the tests' temporary image stores.
    { grep -E '/(\.tmp|brig)[^ ]*/mnt/[0-9a-f]{64} ' /proc/self/mountinfo || true; } | sed 's/^/layer mount /'
    for f in /sys/block/loop*/loop/backing_file; do
      [ -r "$f" ] && grep -H -E '/layers/[0-9a-f]{64}\.erofs' "$f" | sed 's/^/loop device /'
    done 2>/dev/null || true
  } | sort
}
before=$(leftovers)

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# Every test binary runs even after one fails, so a run reports every failure; what
# failed tests left behind is reported too.
tests=0
cargo test --workspace --all-targets --no-fail-fast || tests=$?

sleep 1
new=$(comm -13 <(echo "$before") <(leftovers))
if [ -n "$new" ]; then
  echo "the test suite left this behind:" >&2
  echo "$new" >&2
  exit 1
fi
echo "no leftovers: no brig cgroup, process, mount or loop device remains after the suite"
exit "$tests"
