#!/usr/bin/env bash
# Images: start-up from a tiny and a ~1.4 GiB image side by side, the first-use (verify +
# mount) cost, import throughput next to mkfs.erofs and mksquashfs on the same tree, and
# the cost of --snapshot-to.
#
#   bench/images.sh > report.md      (as root; installs hyperfine, erofs-utils and
#                                     squashfs-tools if missing)
#
# Prints a markdown report on stdout (progress on stderr). Writes nothing in the
# repository: its store, trees and archives live in a private temp dir (TMPDIR, which
# should be a disk, not tmpfs), and on exit, failure or interrupt its images are
# removed, `brig image gc --unmount` runs on its store, anything still mounted below
# the temp dir is unmounted and the temp dir is deleted.
#
# What it measures (the machine is shared and noisy: same-run pairs, medians):
#   1. `brig run --image tiny -- /bin/true` vs `--image big` (+ host mode), layers already
#      mounted: one hyperfine -N run (warmup 20, IMG_RUNS runs)
#   2. first use: the same run right after `brig image gc --unmount` (the layer file's
#      sha256 is checked, then it is mounted) vs mounted; page cache warm, and (IMG_COLD_RUNS)
#      with the page cache dropped too
#   3. import of the big tree as a directory and as a tar, split into brig's phases by a
#      logging `mkfs.erofs` shim first in PATH; mkfs.erofs (-zlz4 as brig, -zlz4hc) and
#      mksquashfs -comp zstd run directly on the same tree; sha256sum passes; and the same
#      for a few large incompressible files (IMG_LARGE_MIB in 8 MiB files)
#   4. `--snapshot-to` after writing 10 and 100 MiB of random data to /workspace, vs the
#      same run without it (hyperfine, IMG_SNAP_RUNS and IMG_SNAP100_RUNS runs)
#
# The random data is in small files on purpose: mkfs.erofs 1.5 with -zlz4hc packs
# incompressible data at ~2.5 MiB/s in files of 1 MiB and up, against ~11 MiB/s in 64 KiB
# files and ~50 MiB/s in 16 KiB files (-zlz4: ~70 MiB/s whatever the size), so 1 GiB in
# large files would take ~7 minutes to import. Section 3 measures that case on IMG_LARGE_MIB, and section 4 hits it
# (one 10 or 100 MiB file), which is why the 100 MiB snapshot gets fewer runs.
#
# Knobs (environment): IMG_RANDOM_MIB (1024) of random data in IMG_RANDOM_FILE_KIB (16) KiB
# files, IMG_USR (/usr/bin /usr/share/man /usr/lib/python3 /usr/lib/python3.X: the
# copy of /usr), IMG_RUNS (300), IMG_FIRST_RUNS (5), IMG_COLD_RUNS (3, 0 skips the
# drop_caches rows), IMG_LARGE_MIB (32), IMG_SNAP_RUNS (5), IMG_SNAP100_RUNS (3).
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "images.sh: run as root" >&2; exit 1; }

RANDOM_MIB="${IMG_RANDOM_MIB:-1024}"
RANDOM_FILE_KIB="${IMG_RANDOM_FILE_KIB:-16}"
RUNS="${IMG_RUNS:-300}"
FIRST_RUNS="${IMG_FIRST_RUNS:-5}"
COLD_RUNS="${IMG_COLD_RUNS:-3}"
LARGE_MIB="${IMG_LARGE_MIB:-32}"
SNAP_RUNS="${IMG_SNAP_RUNS:-5}"
SNAP100_RUNS="${IMG_SNAP100_RUNS:-3}"
if [ -z "${IMG_USR:-}" ]; then
  IMG_USR="/usr/bin /usr/share/man /usr/lib/python3"
  for p in /usr/lib/python3.*; do [ -d "$p" ] && IMG_USR+=" $p"; done
fi

need=()
command -v hyperfine >/dev/null || need+=(hyperfine)
command -v mkfs.erofs >/dev/null || need+=(erofs-utils)
command -v mksquashfs >/dev/null || need+=(squashfs-tools)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
cargo build --release -q

T0=$(date +%s.%N)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
log() { printf '[%6.1fs] %s\n' "$(echo "$(date +%s.%N) - $T0" | bc)" "$*" >&2; }

WORK=""
BRIG=""
STORE=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [ -n "$WORK" ] && [ -d "$WORK" ]; then
    local s n
    for s in "$WORK/store" "$WORK/store-tar"; do
      [ -d "$s" ] && [ -x "$BRIG" ] || continue
      for n in tiny big bigtar large snap; do "$BRIG" image rm "$n" --store "$s" >/dev/null 2>&1; done
      "$BRIG" image gc --unmount --store "$s" >/dev/null 2>&1 || echo "cleanup: gc --unmount failed on $s" >&2
    done
    # Anything still mounted below $WORK (a layer a crashed run left), deepest first.
    local m i
    for i in 1 2 3; do
      mapfile -t mps < <(awk -v w="$WORK/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
      [ ${#mps[@]} -eq 0 ] && break
      for m in "${mps[@]}"; do umount "$m" 2>/dev/null || umount -l "$m"; done
    done
    if awk -v w="$WORK/" 'index($5, w) == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
      echo "cleanup: mounts remain under $WORK, leaving it in place" >&2
    else
      rm -rf --one-file-system "$WORK"
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

WORK=$(mktemp -d "${TMPDIR:-/tmp}/brig-images.XXXXXX")
if [ "$(stat -f -c %T "$WORK")" = tmpfs ]; then
  echo "images.sh: $WORK is on tmpfs (the trees and layers take ~5 GiB of RAM there); set TMPDIR to a disk." >&2
  exit 1
fi
# A private copy, so a concurrent `cargo build` cannot swap the binary mid-run.
cp "target/$(rustc -vV | sed -n "s/^host: //p")/release/brig" "$WORK/brig"
BRIG="$WORK/brig"
STORE="$WORK/store"
B="$BRIG"
S="--store $STORE"

# A mkfs.erofs first in PATH that logs when brig starts and ends it, to split an import
# or a snapshot into before mkfs (unpack + content digest), mkfs, after (sha256 of the
# layer file, fsync, renames).
mkdir "$WORK/shim"
REAL_MKFS=$(command -v mkfs.erofs)
cat > "$WORK/shim/mkfs.erofs" <<EOF
#!/bin/sh
echo "start \$(date +%s.%N)" >> "$WORK/mkfs.log"
"$REAL_MKFS" "\$@"
rc=\$?
echo "end \$(date +%s.%N)" >> "$WORK/mkfs.log"
exit \$rc
EOF
chmod +x "$WORK/shim/mkfs.erofs"
export PATH="$WORK/shim:$PATH"
: > "$WORK/mkfs.log"

now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc; }
# Wall time of a command, in seconds, on stdout; the command's output goes to stderr.
timeit() { local a b; a=$(now); "$@" >&2; b=$(now); secs "$a" "$b"; }
# The last mkfs.erofs start/end pair in the shim's log.
last_mkfs() { tail -2 "$WORK/mkfs.log" | awk '{ print $2 }' | paste -sd' '; }
tree_bytes() { du -s --apparent-size -B1 "$1" | cut -f1; }
tree_files() { find "$1" -type f | wc -l; }
mib() { echo "scale=1; $1 / 1048576" | bc; }
rate() { echo "scale=1; $1 / 1048576 / $2" | bc; }   # bytes, seconds -> MiB/s
f2() { printf '%.2f' "$1"; }
f1() { printf '%.1f' "$1"; }

# ------------------------------------------------------------------------------ trees
log "trees"
TINY="$WORK/tiny"
mkdir -p "$TINY/bin"
for b in /usr/bin/dash /usr/bin/true /usr/bin/head; do
  cp -L "$b" "$TINY/bin/"
  for l in $(ldd "$b" | grep -o '/[^ ]*'); do
    mkdir -p "$TINY$(dirname "$l")"
    cp -L "$l" "$TINY$l"
  done
done
mv "$TINY/bin/dash" "$TINY/bin/sh"

BIG="$WORK/big"
cp -a "$TINY" "$BIG"
python3 - "$BIG/data" "$RANDOM_MIB" "$RANDOM_FILE_KIB" <<'EOF'
import os, sys
root, total_mib, kib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
n = total_mib * 1024 // kib
for i in range(n):
    d = f"{root}/d{i // 1024:03d}"
    if i % 1024 == 0:
        os.makedirs(d, exist_ok=True)
    with open(f"{d}/f{i % 1024:04d}", "wb") as f:
        f.write(os.urandom(kib * 1024))
EOF
for d in $IMG_USR; do
  mkdir -p "$BIG$(dirname "$d")"
  cp -a "$d" "$BIG$(dirname "$d")/"
done
LARGE="$WORK/large"
mkdir "$LARGE"
for i in $(seq $((LARGE_MIB / 8))); do head -c 8M /dev/urandom > "$LARGE/f$i"; done
sync

tiny_bytes=$(tree_bytes "$TINY"); tiny_files=$(tree_files "$TINY")
big_bytes=$(tree_bytes "$BIG"); big_files=$(tree_files "$BIG")
large_bytes=$(tree_bytes "$LARGE")
usr_bytes=0
for d in $IMG_USR; do usr_bytes=$((usr_bytes + $(tree_bytes "$BIG$d"))); done

# ------------------------------------------------------------------------------ imports (3)
log "import tiny"
t_tiny=$(timeit "$B" image import tiny "$TINY" $S)

# import_timed NAME SOURCE STORE -> "total before mkfs after"
import_timed() {
  local a b ms me
  sync
  a=$(now)
  "$B" image import "$1" "$2" --store "$3" >&2
  b=$(now)
  read -r ms me < <(last_mkfs)
  echo "$(secs "$a" "$b") $(secs "$a" "$ms") $(secs "$ms" "$me") $(secs "$me" "$b")"
}
log "import big (directory)"
x=$(import_timed big "$BIG" "$STORE"); read -r imp_dir imp_dir_pre imp_dir_mkfs imp_dir_post <<< "$x"
layer_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["layers"][-1].split(":")[1])' "$1/images/$2.json"; }
BIG_LAYER="$STORE/layers/$(layer_of "$STORE" big).erofs"
TINY_LAYER="$STORE/layers/$(layer_of "$STORE" tiny).erofs"
big_layer_bytes=$(stat -c %s "$BIG_LAYER")
tiny_layer_bytes=$(stat -c %s "$TINY_LAYER")

log "import big (tar)"
tar -C "$BIG" -cf "$WORK/big.tar" .
tar_bytes=$(stat -c %s "$WORK/big.tar")
mkdir "$WORK/store-tar"
x=$(import_timed bigtar "$WORK/big.tar" "$WORK/store-tar"); read -r imp_tar imp_tar_pre imp_tar_mkfs imp_tar_post <<< "$x"
"$B" image rm bigtar --store "$WORK/store-tar" >&2
"$B" image gc --unmount --store "$WORK/store-tar" >&2
rm -rf "$WORK/store-tar" "$WORK/big.tar"

log "mkfs.erofs and mksquashfs directly"
direct() {  # OUT CMD... -> seconds, size
  local out=$1 t
  shift
  sync
  t=$(timeit "$@")
  echo "$t $(stat -c %s "$out")"
  rm -f "$out"
}
x=$(direct "$WORK/d.erofs" "$REAL_MKFS" --quiet -zlz4hc --preserve-mtime "$WORK/d.erofs" "$BIG"); read -r d_lz4hc d_lz4hc_sz <<< "$x"
x=$(direct "$WORK/d.erofs" "$REAL_MKFS" --quiet -zlz4 --preserve-mtime "$WORK/d.erofs" "$BIG"); read -r d_lz4 d_lz4_sz <<< "$x"
x=$(direct "$WORK/d.sqfs" mksquashfs "$BIG" "$WORK/d.sqfs" -comp zstd -no-progress -quiet -noappend); read -r d_sq d_sq_sz <<< "$x"

log "sha256 passes"
sync
t_cat_sha=$(timeit sh -c "find '$BIG' -type f -print0 | xargs -0 cat | sha256sum")
t_layer_sha=$(timeit sha256sum "$BIG_LAYER")

log "large incompressible files ($LARGE_MIB MiB in 8 MiB files)"
x=$(import_timed large "$LARGE" "$STORE"); read -r imp_lg imp_lg_pre imp_lg_mkfs imp_lg_post <<< "$x"
x=$(direct "$WORK/d.erofs" "$REAL_MKFS" --quiet -zlz4hc --preserve-mtime "$WORK/d.erofs" "$LARGE"); read -r l_lz4hc _ <<< "$x"
x=$(direct "$WORK/d.erofs" "$REAL_MKFS" --quiet -zlz4 --preserve-mtime "$WORK/d.erofs" "$LARGE"); read -r l_lz4 _ <<< "$x"
x=$(direct "$WORK/d.sqfs" mksquashfs "$LARGE" "$WORK/d.sqfs" -comp zstd -no-progress -quiet -noappend); read -r l_sq _ <<< "$x"
"$B" image rm large $S >&2
"$B" image gc $S >&2

# ------------------------------------------------------------------------------ 1. start-up
log "start-up, mounted layers"
"$B" run --image tiny $S -- /bin/true
"$B" run --image big $S -- /bin/true
hyperfine -N --warmup 20 --runs "$RUNS" --style basic --export-json "$WORK/start.json" \
  -n 'host: brig run -- /bin/true' "$B run -- /bin/true" \
  -n 'tiny: brig run --image tiny -- /bin/true' "$B run --image tiny $S -- /bin/true" \
  -n 'big: brig run --image big -- /bin/true' "$B run --image big $S -- /bin/true" >&2

# ------------------------------------------------------------------------------ 2. first use
log "first use (gc --unmount before each run)"
GC="$B image gc --unmount $S"
hyperfine -N --warmup 0 --runs "$FIRST_RUNS" --style basic --export-json "$WORK/first.json" \
  -n 'tiny, first use' --prepare "$GC" "$B run --image tiny $S -- /bin/true" \
  -n 'tiny, mounted' --prepare "$B run --image tiny $S -- /bin/true" "$B run --image tiny $S -- /bin/true" \
  -n 'big, first use' --prepare "$GC" "$B run --image big $S -- /bin/true" \
  -n 'big, mounted' --prepare "$B run --image big $S -- /bin/true" "$B run --image big $S -- /bin/true" >&2
if [ "$COLD_RUNS" -gt 0 ]; then
  log "first use, cold page cache"
  DROP="sh -c '$GC >/dev/null && sync && echo 3 > /proc/sys/vm/drop_caches'"
  hyperfine -N --warmup 0 --runs "$COLD_RUNS" --style basic --export-json "$WORK/cold.json" \
    -n 'tiny, first use, cold page cache' --prepare "$DROP" "$B run --image tiny $S -- /bin/true" \
    -n 'big, first use, cold page cache' --prepare "$DROP" "$B run --image big $S -- /bin/true" >&2
fi

# ------------------------------------------------------------------------------ 4. snapshots
snap_log_start=$(wc -l < "$WORK/mkfs.log")
for n in 10 100; do
  log "snapshot, $n MiB"
  W="sh -c 'head -c ${n}M /dev/urandom > /workspace/data'"
  RUN="$B run --image tiny --disk 1G --memory 2G $S"
  runs=$SNAP_RUNS; [ "$n" = 100 ] && runs=$SNAP100_RUNS
  hyperfine -N --warmup 0 --runs "$runs" --style basic --export-json "$WORK/snap$n.json" \
    --prepare "sh -c '$B image rm snap $S >/dev/null 2>&1; $B image gc $S >/dev/null'" \
    -n "$n MiB, no snapshot" "$RUN -- $W" \
    -n "$n MiB, --snapshot-to" "$RUN --snapshot-to snap --replace -- $W" >&2
  # the shim's pairs for these runs: one mkfs per snapshot run
  tail -n +$((snap_log_start + 1)) "$WORK/mkfs.log" > "$WORK/snapmkfs$n.log"
  snap_log_start=$(wc -l < "$WORK/mkfs.log")
done
"$B" image rm snap $S >&2

# ------------------------------------------------------------------------------ report
log "report"
export WORK RUNS FIRST_RUNS COLD_RUNS SNAP_RUNS SNAP100_RUNS RANDOM_MIB RANDOM_FILE_KIB IMG_USR LARGE_MIB \
  tiny_bytes tiny_files big_bytes big_files large_bytes usr_bytes tar_bytes \
  big_layer_bytes tiny_layer_bytes t_tiny \
  imp_dir imp_dir_pre imp_dir_mkfs imp_dir_post imp_tar imp_tar_pre imp_tar_mkfs imp_tar_post \
  d_lz4hc d_lz4hc_sz d_lz4 d_lz4_sz d_sq d_sq_sz t_cat_sha t_layer_sha \
  imp_lg imp_lg_pre imp_lg_mkfs imp_lg_post l_lz4hc l_lz4 l_sq T0 LOAD0
python3 - <<'EOF'
import json, os, statistics, subprocess, time

E = os.environ
W = E["WORK"]
MiB = 1 << 20
f = lambda k: float(E[k])
i = lambda k: int(E[k])
med = statistics.median


def sh(cmd):
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True).stdout.strip()


def hf(name):
    """hyperfine json -> {command name: (median s, min s, max s, n)}"""
    p = f"{W}/{name}.json"
    if not os.path.exists(p):
        return {}
    return {r["command"]: (r["median"], r["min"], r["max"], len(r["times"])) for r in json.load(open(p))["results"]}


def ms(x):
    return f"{x * 1e3:.2f}" if x < 0.1 else f"{x * 1e3:.0f}"


def mib(b):
    return b / MiB


def out(s=""):
    print(s)


cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
ram = sh("free -g | awk '/Mem:/ {print $2}'")
tools = sh("dpkg-query -W -f '${Package} ${Version}, ' erofs-utils squashfs-tools hyperfine tar").rstrip(", ")
fs = sh(f"stat -f -c %T {W}") + " (" + sh(f"df --output=source {W} | tail -1") + ")"
rev = sh("git rev-parse --short HEAD")
dirty = sh("git status --porcelain | wc -l")
load = sh("cut -d' ' -f1-3 /proc/loadavg")
out("# Images: start-up, first use, import, snapshots (raw output of bench/images.sh)")
out()
out(f"Machine: {cpu}, {os.cpu_count()} CPUs, {ram} GiB, Linux {os.uname().release}; {tools}; store and trees on "
    f"{fs}. brig {rev} ({dirty} files modified or new in the work tree), `cargo build --release`, run as root. "
    f"Load average at start {E['LOAD0']}, at end {load}. Run {time.strftime('%Y-%m-%d')}, "
    f"{time.time() - f('T0'):.0f} s in all.")
out()
out(f"Images: **tiny** = `/bin/sh` (dash), `/bin/true`, `/bin/head` and their libraries: {i('tiny_files')} files, "
    f"{mib(i('tiny_bytes')):.1f} MiB, layer {mib(i('tiny_layer_bytes')):.1f} MiB. "
    f"**big** = tiny + {E['RANDOM_MIB']} MiB of random data in {E['RANDOM_FILE_KIB']} KiB files + a copy of "
    f"`{E['IMG_USR']}` ({mib(i('usr_bytes')):.0f} MiB): {i('big_files')} files, {mib(i('big_bytes')):.0f} MiB, "
    f"layer {mib(i('big_layer_bytes')):.0f} MiB. Both are one layer (EROFS `-zlz4 --preserve-mtime`), in a "
    f"private store.")
out()

# ---------------------------------------------------------------- 1
st = hf("start")
host, tiny, big = (st[k][0] for k in ("host: brig run -- /bin/true", "tiny: brig run --image tiny -- /bin/true",
                                      "big: brig run --image big -- /bin/true"))
out("## 1. Start-up does not depend on image size")
out()
out(f"`hyperfine -N --warmup 20 --runs {E['RUNS']}`, the three commands in one run; both images' layers mounted "
    f"beforehand by one run each.")
out()
out("| command | median ms | min–max ms | vs tiny |")
out("|---|---:|---:|---:|")
for k, (m, lo, hi, n) in st.items():
    out(f"| `{k.split(': ', 1)[1]}` | {ms(m)} | {ms(lo)}–{ms(hi)} | {m / tiny:.3f} |")
out()
r = big / tiny
out(f"big/tiny = **{r:.3f}** (bar: within 10%: **{'met' if abs(r - 1) <= 0.10 else 'NOT met'}**); "
    f"an image costs {ms(tiny - host)} ms over host mode (tiny).")
out()

# ---------------------------------------------------------------- 2
fu = hf("first")
cold = hf("cold")
out("## 2. First use: verify and mount")
out()
out(f"First use = the run right after `brig image gc --unmount` (hyperfine `--prepare`), so brig checks the layer "
    f"file's sha256 against its record and mounts it; mounted = the prepare is a run of the same image. "
    f"`hyperfine -N --runs {E['FIRST_RUNS']}`, all four in one run; page cache warm (the layer files were just "
    f"written and read)."
    + (f" Cold page cache rows: the prepare also does `sync; echo 3 > /proc/sys/vm/drop_caches` "
       f"({E['COLD_RUNS']} runs)." if cold else ""))
out()
out("| image | layer MiB | state | median ms | min–max ms | first use − mounted |")
out("|---|---:|---|---:|---:|---:|")
lay = {"tiny": i("tiny_layer_bytes"), "big": i("big_layer_bytes")}
for img in ("tiny", "big"):
    mounted = fu[f"{img}, mounted"][0]
    for state, d in (("mounted", fu), ("first use", fu), ("first use, cold page cache", cold)):
        k = f"{img}, {state}"
        if k not in d:
            continue
        m, lo, hi, n = d[k]
        extra = "" if state == "mounted" else f"{ms(m - mounted)} ms"
        if state != "mounted" and img == "big":
            extra += f" ({mib(lay[img]) / (m - mounted):.0f} MiB/s of layer)"
        out(f"| {img} | {mib(lay[img]):.1f} | {state} | {ms(m)} | {ms(lo)}–{ms(hi)} | {extra} |")
out()
out(f"For scale: `sha256sum` (coreutils) of the big layer file, page cache warm: {f('t_layer_sha'):.2f} s "
    f"({mib(lay['big']) / f('t_layer_sha'):.0f} MiB/s).")
out()

# ---------------------------------------------------------------- 3
bb = i("big_bytes")
out("## 3. Import throughput")
out()
out(f"Input = the big tree, {mib(bb):.0f} MiB of file data (`du --apparent-size`), page cache warm, `sync` before "
    f"each. One run of each (a single pack takes tens of seconds). brig's phases come from a `mkfs.erofs` shim first "
    f"in PATH that logs when brig starts and ends it: *before mkfs* = brig start, store open, unpack (tar) and the "
    f"content digest (sha256 over every file and its metadata); *after mkfs* = sha256 of the layer file, fsync, "
    f"renames, image record, and for the tar the removal of the unpacked tree.")
out()
out("| what | wall s | MiB/s of input | before mkfs s | mkfs s | after mkfs s | output MiB |")
out("|---|---:|---:|---:|---:|---:|---:|")
bl = i("big_layer_bytes")
out(f"| `brig image import` directory | {f('imp_dir'):.1f} | {mib(bb) / f('imp_dir'):.0f} | {f('imp_dir_pre'):.1f} | "
    f"{f('imp_dir_mkfs'):.1f} | {f('imp_dir_post'):.1f} | {mib(bl):.0f} |")
out(f"| `brig image import` tar ({mib(i('tar_bytes')):.0f} MiB, plain) | {f('imp_tar'):.1f} | "
    f"{mib(bb) / f('imp_tar'):.0f} | {f('imp_tar_pre'):.1f} | {f('imp_tar_mkfs'):.1f} | {f('imp_tar_post'):.1f} | |")
out(f"| `mkfs.erofs -zlz4hc --preserve-mtime` | {f('d_lz4hc'):.1f} | {mib(bb) / f('d_lz4hc'):.0f} | | | | "
    f"{mib(i('d_lz4hc_sz')):.0f} |")
out(f"| `mkfs.erofs -zlz4 --preserve-mtime` | {f('d_lz4'):.1f} | {mib(bb) / f('d_lz4'):.0f} | | | | "
    f"{mib(i('d_lz4_sz')):.0f} |")
out(f"| `mksquashfs -comp zstd` ({os.cpu_count()} threads) | {f('d_sq'):.1f} | {mib(bb) / f('d_sq'):.0f} | | | | "
    f"{mib(i('d_sq_sz')):.0f} |")
out(f"| `find -type f … \\| xargs cat \\| sha256sum` (read + hash every file) | {f('t_cat_sha'):.1f} | "
    f"{mib(bb) / f('t_cat_sha'):.0f} | | | | |")
out(f"| `sha256sum` of the layer file | {f('t_layer_sha'):.1f} | {mib(bl) / f('t_layer_sha'):.0f} (of layer) | | | | |")
out()
lb = i("large_bytes")
out(f"Large incompressible files: {mib(lb):.0f} MiB of random data in 8 MiB files (same method):")
out()
out("| what | wall s | MiB/s | before mkfs s | mkfs s | after mkfs s |")
out("|---|---:|---:|---:|---:|---:|")
out(f"| `brig image import` directory | {f('imp_lg'):.1f} | {mib(lb) / f('imp_lg'):.1f} | {f('imp_lg_pre'):.2f} | "
    f"{f('imp_lg_mkfs'):.1f} | {f('imp_lg_post'):.2f} |")
for n, k in (("`mkfs.erofs -zlz4hc`", "l_lz4hc"), ("`mkfs.erofs -zlz4`", "l_lz4"), ("`mksquashfs -comp zstd`", "l_sq")):
    out(f"| {n} | {f(k):.1f} | {mib(lb) / f(k):.1f} | | | |")
out()

# ---------------------------------------------------------------- 4
out("## 4. Snapshots")
out()
out(f"`brig run --image tiny --disk 1G --memory 2G -- sh -c 'head -c NM /dev/urandom > /workspace/data'` with and "
    f"without `--snapshot-to snap --replace`; `hyperfine -N --runs {E['SNAP_RUNS']}` (10 MiB) and `--runs {E['SNAP100_RUNS']}` (100 MiB), both commands in one run, with a prepare "
    f"that removes `snap` and gc's its layer. Snapshot cost = difference of medians. mkfs = the shim's time for "
    f"the snapshot's `mkfs.erofs` (median).")
out()
out("| writes | no snapshot ms | --snapshot-to ms | snapshot cost ms | of which mkfs ms | MiB/s |")
out("|---:|---:|---:|---:|---:|---:|")
for n in (10, 100):
    d = hf(f"snap{n}")
    a, b = d[f"{n} MiB, no snapshot"][0], d[f"{n} MiB, --snapshot-to"][0]
    lines = open(f"{W}/snapmkfs{n}.log").read().split()
    starts = [float(lines[j + 1]) for j in range(0, len(lines), 2) if lines[j] == "start"]
    ends = [float(lines[j + 1]) for j in range(0, len(lines), 2) if lines[j] == "end"]
    mk = med([e - s for s, e in zip(starts, ends)]) if starts else float("nan")
    out(f"| {n} MiB | {ms(a)} | {ms(b)} | {ms(b - a)} | {ms(mk)} | {n / (b - a):.1f} |")
out()
EOF
log "done"
