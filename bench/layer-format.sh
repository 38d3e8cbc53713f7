#!/usr/bin/env bash
# On-disk format for brig's read-only image layers: EROFS next to squashfs, measured side
# by side in one run on the same tree.
#
#   bench/layer-format.sh > report.md        (as root; installs erofs-utils,
#                                              squashfs-tools, attr, gcc if missing)
#
# Prints a markdown report on stdout (progress goes to stderr). Writes nothing in the
# repository: everything lives in a private temp dir that is removed on exit, together
# with every mount made under it and every loop device this script attached (detached
# by the device name it got back, and only while still bound to one of its images).
#
# What it measures (medians of interleaved repeats; the machine is shared and noisy):
#   1. a copy of a realistic tree (LF_SRC, default /usr/bin /usr/share/man /usr/lib/python3.X:
#      binaries, many small files, a python stdlib with its .pyc) in the temp dir
#   2. pack wall time, CPU time, image size, input MiB/s: mkfs.erofs (none, lz4, lz4hc)
#      vs mksquashfs (zstd, lz4, gzip; -processors 2)
#   3. mount(2)/umount(2) time: EROFS file-backed, EROFS via loop, squashfs via loop
#      (LOOP_CTL_GET_FREE + LOOP_CONFIGURE + mount(2), in process), plus util-linux
#      `mount -o loop` as a whole command; warm and cold page cache; loop devices used
#   4. reads, cold page cache (sync; echo 3 > /proc/sys/vm/drop_caches before each):
#      tar of the whole tree, find+lstat of every entry, cat of 2000 random files (fixed
#      seed), python3 start-up importing stdlib modules from the layer (PYTHONHOME);
#      warm tar and warm python too
#   5. features: user.*/trusted.* xattrs, 0:0 char whiteouts, mtimes, owners, hardlinks,
#      file-backed mount, and reproducibility (same tree => same bytes) with and
#      without fixed timestamps, checked by packing, mounting and reading back
#
# Everything runs in a private mount namespace (the script re-executes itself under
# `unshare --mount --propagation private`). Takes ~8 minutes with the defaults on a quiet
# 2-vCPU VM, ~10 under load.
#
# Knobs (environment): LF_SRC, LF_PACK_RUNS (3), LF_READ_RUNS (5), LF_MOUNT_RUNS (20),
# LF_MOUNT_COLD_RUNS (5), LF_RAND_FILES (2000), TMPDIR (must not be tmpfs);
# LF_EROFS_C64K=1 adds an EROFS lz4hc image with 64 KiB pclusters (-C65536
# -Eztailpacking) to packs and reads; LF_PARALLEL=1 adds a cold whole-tree read by two
# parallel readers (each adds about a minute).
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "layer-format.sh: run as root" >&2; exit 1; }

# Run in a private mount namespace: our mounts neither propagate into nor get copied by
# other mount namespaces (a sandbox started meanwhile with a recursive bind of / would
# otherwise pin our loop devices after we unmount), and if this script is killed outright
# the namespace dies with it, taking its mounts (and so its autoclear loop devices) along.
if [ -z "${LF_IN_PRIVATE_NS:-}" ]; then
  LF_IN_PRIVATE_NS=1 exec unshare --mount --propagation private -- "$(realpath "$0")" "$@"
fi
cd "$(dirname "$0")/.."

need=()
command -v mkfs.erofs >/dev/null || need+=(erofs-utils)
command -v mksquashfs >/dev/null || need+=(squashfs-tools)
command -v getfattr >/dev/null || need+=(attr)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ -z "${LF_SRC:-}" ]; then
  LF_SRC="/usr/bin /usr/share/man"
  for p in /usr/lib/python3.*; do [ -d "$p" ] && LF_SRC+=" $p"; done
fi
export LF_SRC

WORK=""
DRIVER=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  # 0. the measurement driver and whatever it is running (its own process group)
  if [ -n "$DRIVER" ] && kill -0 "$DRIVER" 2>/dev/null; then
    kill -TERM -- "-$DRIVER" 2>/dev/null
    wait "$DRIVER" 2>/dev/null
  fi
  if [ -n "$WORK" ] && [ -d "$WORK" ]; then
    # 1. every mount under $WORK, deepest first (autoclear loop devices go with them)
    local m i
    for i in 1 2 3; do
      mapfile -t mps < <(awk -v w="$WORK/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
      [ ${#mps[@]} -eq 0 ] && break
      for m in "${mps[@]}"; do umount "$m" 2>/dev/null || umount -l "$m"; done
    done
    # 2. loop devices this script attached, by the names it recorded, if still bound
    #    to a file in $WORK (so a device reused by someone else is never touched)
    local dev bf
    if [ -f "$WORK/loops" ]; then
      while read -r dev; do
        bf=$(cat "/sys/block/${dev#/dev/}/loop/backing_file" 2>/dev/null) || continue
        case "$bf" in "$WORK"/*) losetup -d "$dev" && echo "cleanup: detached $dev" >&2 ;; esac
      done < <(sort -u "$WORK/loops")
    fi
    # 3. the temp dir, only once nothing is mounted below it any more
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

WORK=$(mktemp -d "${TMPDIR:-/tmp}/brig-layer-format.XXXXXX")
export LF_WORK="$WORK"
if [ "$(stat -f -c %T "$WORK")" = tmpfs ]; then
  echo "layer-format.sh: $WORK is on tmpfs; drop_caches could not make reads cold. Set TMPDIR to a disk." >&2
  exit 1
fi

# ---------------------------------------------------------------------------------------
# lfmnt: the mount(2) side, timed in process (no exec or libmount cost in the numbers)
cat > "$WORK/lfmnt.c" <<'EOF'
/* lfmnt file|loop FSTYPE IMAGE DIR [OPTS]  |  lfmnt umount DIR
 * file: mount(2) with the image file itself as the source (EROFS file-backed mount)
 * loop: LOOP_CTL_GET_FREE + LOOP_CONFIGURE(read-only, autoclear) + mount(2) of /dev/loopN
 * Prints "dev=... attach_ns=... mount_ns=... total_ns=..." or "umount_ns=...". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "umount")) {
    long long t0 = now_ns();
    if (umount2(argv[2], 0)) { fprintf(stderr, "umount %s: %s\n", argv[2], strerror(errno)); return 1; }
    printf("umount_ns=%lld\n", now_ns() - t0);
    return 0;
  }
  if (argc < 5 || argc > 6) { fprintf(stderr, "usage: lfmnt file|loop FSTYPE IMAGE DIR [OPTS] | umount DIR\n"); return 2; }
  const char *fstype = argv[2], *img = argv[3], *dir = argv[4], *opts = argc > 5 ? argv[5] : NULL;
  if (!strcmp(argv[1], "file")) {
    long long t0 = now_ns();
    if (mount(img, dir, fstype, MS_RDONLY, opts)) { fprintf(stderr, "mount %s: %s\n", img, strerror(errno)); return 1; }
    long long t1 = now_ns();
    printf("dev=- attach_ns=0 mount_ns=%lld total_ns=%lld\n", t1 - t0, t1 - t0);
    return 0;
  }
  if (strcmp(argv[1], "loop")) { fprintf(stderr, "bad mode %s\n", argv[1]); return 2; }
  long long t0 = now_ns();
  int ifd = open(img, O_RDONLY | O_CLOEXEC);
  if (ifd < 0) { perror(img); return 1; }
  int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (ctl < 0) { perror("/dev/loop-control"); return 1; }
  char dev[32];
  int lfd = -1;
  for (int tries = 0; tries < 50 && lfd < 0; tries++) {
    int n = ioctl(ctl, LOOP_CTL_GET_FREE);
    if (n < 0) { perror("LOOP_CTL_GET_FREE"); return 1; }
    snprintf(dev, sizeof dev, "/dev/loop%d", n);
    lfd = open(dev, O_RDONLY | O_CLOEXEC);
    if (lfd < 0) { if (errno == ENOENT) { usleep(1000); continue; } perror(dev); return 1; }
    struct loop_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.fd = ifd;
    cfg.info.lo_flags = LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR;
    strncpy((char *)cfg.info.lo_file_name, img, LO_NAME_SIZE - 1);
    if (ioctl(lfd, LOOP_CONFIGURE, &cfg)) {
      if (errno != EBUSY) { perror("LOOP_CONFIGURE"); return 1; }
      close(lfd); lfd = -1; /* raced with another loop-control user: take the next free one */
    }
  }
  if (lfd < 0) { fprintf(stderr, "no free loop device\n"); return 1; }
  long long t1 = now_ns();
  /* autoclear: if the mount fails, closing lfd at exit detaches the device again */
  if (mount(dev, dir, fstype, MS_RDONLY, opts)) { fprintf(stderr, "mount %s (%s): %s\n", dev, img, strerror(errno)); return 1; }
  long long t2 = now_ns();
  close(lfd);
  printf("dev=%s attach_ns=%lld mount_ns=%lld total_ns=%lld\n", dev, t1 - t0, t2 - t1, t2 - t0);
  return 0;
}
EOF
gcc -O2 -Wall -o "$WORK/lfmnt" "$WORK/lfmnt.c"

# ---------------------------------------------------------------------------------------
cat > "$WORK/driver.py" <<'EOF'
import glob, hashlib, os, platform, random, resource, shutil, statistics, subprocess as sp, sys, time

W = os.environ["LF_WORK"]
SRC = os.environ["LF_SRC"].split()
PACK_RUNS = int(os.environ.get("LF_PACK_RUNS", 3))
READ_RUNS = int(os.environ.get("LF_READ_RUNS", 5))
MOUNT_RUNS = int(os.environ.get("LF_MOUNT_RUNS", 20))
MOUNT_COLD_RUNS = int(os.environ.get("LF_MOUNT_COLD_RUNS", 5))
RAND_FILES = int(os.environ.get("LF_RAND_FILES", 2000))
SEED = 20261121
UUID = "0b1e7a5e-1a7e-4f00-8000-000000000001"
HELPER = f"{W}/lfmnt"
TREE, IMG, MNT = f"{W}/tree", f"{W}/img", f"{W}/mnt"
T0 = time.time()
MiB = 1 << 20


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def out(line=""):
    print(line, flush=True)


def run(cmd, **kw):
    return sp.run(cmd, check=True, **kw)


def bash(cmd):
    return sp.run(["bash", "-o", "pipefail", "-c", cmd], check=True, stdout=sp.PIPE, text=True).stdout


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def pagecache_kib():
    m = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            m[k] = int(v.split()[0])
    return m["Cached"] + m["Buffers"]


def timed(fn, *a, **kw):
    t = time.perf_counter()
    r = fn(*a, **kw)
    return time.perf_counter() - t, r


def rotate(xs, r):
    r %= len(xs)
    return xs[r:] + xs[:r]


def med(xs):
    return statistics.median(xs)


def fmt_s(xs, unit="ms", prec=None):
    scale = {"s": 1, "ms": 1e3, "us": 1e6}[unit]
    v = [x * scale for x in xs]
    p = prec if prec is not None else (0 if med(v) >= 100 else 1 if med(v) >= 10 else 2)
    return f"{med(v):.{p}f} ({min(v):.{p}f}–{max(v):.{p}f})"


def note_loop(dev):
    with open(f"{W}/loops", "a") as f:
        f.write(dev + "\n")


def loop_backing(dev):
    try:
        with open(f"/sys/block/{os.path.basename(dev)}/loop/backing_file") as f:
            return f.read().strip()
    except OSError:
        return None


def hmount(kind, fstype, img, d, opts=None):
    os.makedirs(d, exist_ok=True)
    t = time.perf_counter()
    r = sp.run([HELPER, kind, fstype, img, d] + ([opts] if opts else []), capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode:
        raise RuntimeError(r.stderr.strip())
    o = dict(kv.split("=", 1) for kv in r.stdout.split())
    if o["dev"] != "-":
        note_loop(o["dev"])
    return {"dev": o["dev"], "attach": int(o["attach_ns"]) / 1e9, "mount": int(o["mount_ns"]) / 1e9,
            "total": int(o["total_ns"]) / 1e9, "wall": wall}


def humount(d, dev="-"):
    t = time.perf_counter()
    r = run([HELPER, "umount", d], capture_output=True, text=True)
    wall = time.perf_counter() - t
    held = False
    if dev != "-":  # autoclear should release it now, unless something else still holds it
        for _ in range(100):
            if not (loop_backing(dev) or "").startswith(W):
                break
            time.sleep(0.01)
        else:
            held = True
            log(f"{dev} still attached 1 s after umount (autoclear: it goes when its last user does)")
    return {"umount": int(r.stdout.split("=")[1]) / 1e9, "wall": wall, "held": held}


def tree_stats(root):
    n = {"reg": 0, "dir": 0, "lnk": 0, "other": 0}
    size, seen, files = 0, set(), []
    for dp, dns, fns in os.walk(root):
        n["dir"] += 1
        for fn in fns + [d for d in dns if os.path.islink(os.path.join(dp, d))]:
            p = os.path.join(dp, fn)
            st = os.lstat(p)
            if os.path.islink(p):
                n["lnk"] += 1
            elif os.path.isfile(p):
                n["reg"] += 1
                if st.st_ino not in seen:
                    seen.add(st.st_ino)
                    size += st.st_size
                if st.st_size > 0:
                    files.append(os.path.relpath(p, root))
            else:
                n["other"] += 1
    return n, size, sorted(files)


def manifest(root, content=True):
    """path -> metadata (and content hash) of every entry below root, root included."""
    m = {}
    for dp, dns, fns in os.walk(root):
        for name in [None] + dns + fns:
            p = dp if name is None else os.path.join(dp, name)
            if name is None and dp != root:
                continue
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            try:
                xs = {k: os.getxattr(p, k, follow_symlinks=False) for k in os.listxattr(p, follow_symlinks=False)}
            except OSError:
                xs = {}
            e = {"type": st.st_mode >> 12, "perm": oct(st.st_mode & 0o7777), "uid": st.st_uid, "gid": st.st_gid,
                 "size": st.st_size if not os.path.isdir(p) else None, "nlink": st.st_nlink if not os.path.isdir(p) else None,
                 "rdev": (os.major(st.st_rdev), os.minor(st.st_rdev)) if st.st_rdev else None,
                 "mtime_s": st.st_mtime_ns // 10**9, "mtime_ns": st.st_mtime_ns, "xattrs": xs,
                 "link": os.readlink(p) if os.path.islink(p) else None}
            if content and os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    e["sha256"] = hashlib.sha256(f.read()).hexdigest()
            m[rel] = e
    return m


def diff_manifest(a, b, keys):
    bad = {k: [] for k in keys}
    for p in sorted(set(a) | set(b)):
        for k in keys:
            if p not in a or p not in b or a[p].get(k) != b[p].get(k):
                bad[k].append(p)
    return bad


def python_cmd(m):
    pys = sorted(glob.glob(f"{m}/usr/bin/python3.[0-9]*"))
    pys = [p for p in pys if not p.endswith("-config") and os.path.isdir(f"{m}/usr/lib/{os.path.basename(p)}")]
    if not pys:
        return None
    return (f"PYTHONHOME={m}/usr {pys[0]} -S -c 'import json, email.parser, http.client, asyncio, "
            f"decimal, argparse, logging, sqlite3, ssl, unittest'")


def pyc_check(m):
    """(pycs used, modules compiled from source) for the python start-up workload."""
    cmd = python_cmd(m)
    r = sp.run(["bash", "-c", cmd.replace(" -S ", " -S -v ")], capture_output=True, text=True, check=True)
    used = sum(1 for l in r.stderr.splitlines() if l.startswith("# ") and " matches " in l)
    src = sum(1 for l in r.stderr.splitlines() if l.startswith("# code object from ") and l.rstrip("'").endswith(".py"))
    return used, src


# ----------------------------------------------------------------------------- machine
def sh1(cmd):
    try:
        return sp.run(["bash", "-c", cmd], capture_output=True, text=True).stdout.strip()
    except Exception:
        return "?"


cpu = sh1("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2")
ram = sh1("free -g | awk '/Mem:/ {print $2}'")
load = sh1("cut -d' ' -f1-3 /proc/loadavg")
tools = sh1("dpkg-query -W -f '${Package} ${Version}, ' erofs-utils squashfs-tools util-linux tar")
kcfg = sh1("zcat /proc/config.gz 2>/dev/null | grep -E '^CONFIG_(SQUASHFS_DECOMP_[A-Z_]+|SQUASHFS_FILE_[A-Z]+|"
           "EROFS_FS_BACKED_BY_FILE|EROFS_FS_ZIP_[A-Z]+|BLK_DEV_LOOP_MIN_COUNT)=' | tr '\\n' ' '")
wfs = sh1(f"stat -f -c %T {W}") + " (" + sh1(f"df --output=source {W} | tail -1") + ")"
maxloop = sh1("cat /sys/module/loop/parameters/max_loop")
out("# Layer format: EROFS vs squashfs (raw output of bench/layer-format.sh)")
out()
out(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
out(f"- kernel: {platform.release()}; CPU: {cpu.strip()} x {os.cpu_count()}; RAM: {ram} GiB; load avg at start: {load}")
out(f"- tools: {tools} python {platform.python_version()} (driver)")
out(f"- kernel config: {kcfg}")
out(f"- work dir on {wfs}; loop module max_loop={maxloop}")
out()

# ----------------------------------------------------------------------------- 1. tree
log(f"copying {' '.join(SRC)}")
os.makedirs(TREE)
copy_s, _ = timed(run, ["cp", "-a", "--parents", *[s.lstrip("/") for s in SRC], TREE], cwd="/")  # cp 9.1 --parents fails on absolute sources
counts, in_bytes, regfiles = tree_stats(TREE)
du_mib = int(sh1(f"du -sm {TREE}").split()[0])
in_mib = in_bytes / MiB
rng = random.Random(SEED)
rand = rng.sample(regfiles, min(RAND_FILES, len(regfiles)))
with open(f"{W}/rand.list", "w") as f:
    f.write("".join(p + "\n" for p in rand))
rand_bytes = sum(os.lstat(os.path.join(TREE, p)).st_size for p in rand)
out("## 1. Tree")
out()
out(f"Copy (`cp -a --parents`) of {', '.join(f'`{s}`' for s in SRC)}: **{in_mib:.0f} MiB** of file data "
    f"({du_mib} MiB on disk), **{sum(counts.values())} entries**: {counts['reg']} regular files, {counts['dir']} directories, "
    f"{counts['lnk']} symlinks, {counts['other']} other. Copied in {copy_s:.1f} s. "
    f"Random-read list: {len(rand)} regular files (seed {SEED}), {rand_bytes / MiB:.1f} MiB.")
out()

# ----------------------------------------------------------------------------- 2. pack
EROFS = ["mkfs.erofs", "--quiet", "--preserve-mtime", "-U", UUID]
SQFS = ["-processors", "2", "-no-progress", "-quiet", "-noappend"]
PACKS = [
    ("erofs-none", EROFS + ["{img}", TREE]),
    ("erofs-lz4", EROFS + ["-zlz4", "{img}", TREE]),
    ("erofs-lz4hc", EROFS + ["-zlz4hc", "{img}", TREE]),
] + ([("erofs-lz4hc-C64k", EROFS + ["-zlz4hc", "-C65536", "-Eztailpacking", "{img}", TREE])]
     if os.environ.get("LF_EROFS_C64K") else []) + [
    ("sqfs-zstd", ["mksquashfs", TREE, "{img}", "-comp", "zstd"] + SQFS),
    ("sqfs-lz4", ["mksquashfs", TREE, "{img}", "-comp", "lz4"] + SQFS),
    ("sqfs-gzip", ["mksquashfs", TREE, "{img}", "-comp", "gzip"] + SQFS),
]
os.makedirs(IMG)
img = {n: f"{IMG}/{n}.img" for n, _ in PACKS}
packt = {n: {"wall": [], "cpu": [], "size": []} for n, _ in PACKS}
for r in range(PACK_RUNS):
    for name, cmd in rotate(PACKS, r):
        log(f"pack {r + 1}/{PACK_RUNS} {name}")
        if os.path.exists(img[name]):
            os.unlink(img[name])
        os.sync()
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        run([a.replace("{img}", img[name]) for a in cmd], stdout=sp.DEVNULL)
        wall = time.perf_counter() - t
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        os.sync()  # writeback outside the timed region
        packt[name]["wall"].append(wall)
        packt[name]["cpu"].append(c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime)
        packt[name]["size"].append(os.stat(img[name]).st_size)

out("## 2. Pack time and size")
out()
out(f"{PACK_RUNS} interleaved runs per packer (order rotated each round), input tree warm in page cache, "
    "image written to the same disk, `sync` after each run outside the timing. Wall and CPU (user+sys of the "
    "packer) are median (min–max). Throughput = input file data / median wall. mkfs.erofs 1.5 is single-threaded; "
    "mksquashfs used `-processors 2`. Every EROFS run had `--preserve-mtime -U <fixed uuid>`.")
out()
out("| image | command | wall s | CPU s | MiB/s in | size MiB | % of input |")
out("|---|---|---:|---:|---:|---:|---:|")
for name, cmd in PACKS:
    p = packt[name]
    shown = " ".join(a for a in cmd if a not in (TREE, "{img}", "--quiet", "-quiet", "-no-progress", "-noappend", UUID, "-U"))
    sz = p["size"][-1]
    same = "" if len(set(p["size"])) == 1 else " (sizes varied)"
    out(f"| {name} | `{shown}` | {fmt_s(p['wall'], 's', 1)} | {fmt_s(p['cpu'], 's', 1)} | {in_mib / med(p['wall']):.0f} | "
        f"{sz / MiB:.0f}{same} | {100 * sz / in_bytes:.0f} |")
out()

# ----------------------------------------------------------------------------- 3. mount
MM = [
    ("EROFS file-backed: mount(2) on the image file", "file", "erofs", img["erofs-lz4hc"]),
    ("EROFS via loop: LOOP_CONFIGURE + mount(2)", "loop", "erofs", img["erofs-lz4hc"]),
    ("squashfs via loop: LOOP_CONFIGURE + mount(2)", "loop", "squashfs", img["sqfs-zstd"]),
]
UM = [
    ("util-linux `mount -o ro,loop -t erofs` (whole command)", "erofs", img["erofs-lz4hc"]),
    ("util-linux `mount -o ro,loop -t squashfs` (whole command)", "squashfs", img["sqfs-zstd"]),
]
md = f"{MNT}/m"
res = {n: {"attach": [], "mount": [], "total": [], "umount": [], "mwall": [], "uwall": [], "loops": set()} for n, *_ in MM + UM}
cold = {n: [] for n, *_ in MM}
log("mount/umount")
for n, kind, fs, im in MM:  # warm-up
    humount(md, hmount(kind, fs, im, md)["dev"])
for r in range(MOUNT_RUNS):
    for n, kind, fs, im in rotate(MM, r):
        m = hmount(kind, fs, im, md)
        u = humount(md, m["dev"])
        x = res[n]
        for k in ("attach", "mount", "total"):
            x[k].append(m[k])
        x["mwall"].append(m["wall"])
        x["umount"].append(u["umount"])
        x["uwall"].append(u["wall"])
        if m["dev"] != "-":
            x["loops"].add(m["dev"])
    for n, fs, im in rotate(UM, r):
        t = time.perf_counter()
        run(["mount", "-t", fs, "-o", "ro,loop", im, md])
        mw = time.perf_counter() - t
        dev = bash(f"findmnt -n -o SOURCE {md}").strip()
        if dev.startswith("/dev/loop"):
            note_loop(dev)
            res[n]["loops"].add(dev)
        t = time.perf_counter()
        run(["umount", md])
        res[n]["mwall"].append(mw)
        res[n]["uwall"].append(time.perf_counter() - t)
        for _ in range(200):
            if not (loop_backing(dev) or "").startswith(W):
                break
            time.sleep(0.01)
for r in range(MOUNT_COLD_RUNS):
    for n, kind, fs, im in rotate(MM, r):
        drop_caches()
        m = hmount(kind, fs, im, md)
        cold[n].append(m["total"])
        humount(md, m["dev"])

out("## 3. Mount and unmount")
out()
out(f"Images: erofs-lz4hc and sqfs-zstd from section 2. In-process times come from a small C helper (`lfmnt`, built "
    f"by the script) around the syscalls: attach = open(image) + LOOP_CTL_GET_FREE + open(/dev/loopN) + LOOP_CONFIGURE "
    f"(read-only, autoclear: the device goes away with the last umount); mount = mount(2). Warm = image metadata in "
    f"page cache, {MOUNT_RUNS} interleaved runs; cold = `drop_caches` before each mount, {MOUNT_COLD_RUNS} runs. "
    f"Process wall = fork+exec+run of the helper or of util-linux `mount`/`umount` as seen by the driver. "
    f"Median (min–max), µs unless noted.")
out()
out("| method | loop devices per mount | attach µs | mount(2) µs | total µs (warm) | total µs (cold) | umount(2) µs | mount process wall ms | umount process wall ms |")
out("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for n, kind, *_ in MM:
    x = res[n]
    out(f"| {n} | {0 if kind == 'file' else 1} | {fmt_s(x['attach'], 'us') if kind == 'loop' else '0'} | {fmt_s(x['mount'], 'us')} | "
        f"{fmt_s(x['total'], 'us')} | {fmt_s(cold[n], 'us')} | {fmt_s(x['umount'], 'us')} | {fmt_s(x['mwall'])} | {fmt_s(x['uwall'])} |")
for n, *_ in UM:
    x = res[n]
    out(f"| {n} | 1 | | | | | | {fmt_s(x['mwall'])} | {fmt_s(x['uwall'])} |")
out()
r = sp.run([HELPER, "file", "squashfs", img["sqfs-zstd"], md], capture_output=True, text=True)
if r.returncode == 0:
    humount(md)
out(f"squashfs without a loop device (`mount(2)` with the image file as source): "
    f"{'**works**' if r.returncode == 0 else '`' + r.stderr.strip().replace(W, '$WORK') + '`'}. "
    f"Distinct loop devices used across the loop runs: " +
    ", ".join(f"{n.split(':')[0].split(' (')[0]}: {len(res[n]['loops'])}" for n, *_ in MM + UM if res[n]["loops"]) +
    " (autoclear frees each device at umount; the next mount reuses it).")
out()

# ----------------------------------------------------------------------------- 4. reads
READS = [
    ("erofs-none, file-backed", "file", "erofs", "erofs-none", None),
    ("erofs-lz4hc, file-backed", "file", "erofs", "erofs-lz4hc", None),
    ("erofs-lz4hc, file-backed, directio", "file", "erofs", "erofs-lz4hc", "directio"),
    ("erofs-lz4hc, loop", "loop", "erofs", "erofs-lz4hc", None),
] + ([("erofs-lz4hc-C64k, file-backed", "file", "erofs", "erofs-lz4hc-C64k", None)]
     if os.environ.get("LF_EROFS_C64K") else []) + [
    ("sqfs-zstd, loop", "loop", "squashfs", "sqfs-zstd", None),
    ("sqfs-lz4, loop", "loop", "squashfs", "sqfs-lz4", None),
]
mnt = {}
devs = {}
for i, (n, kind, fs, im, opts) in enumerate(READS):
    mnt[n] = f"{MNT}/r{i}"
    devs[n] = hmount(kind, fs, img[im], mnt[n], opts)["dev"]
ours = [d for d in devs.values() if d != "-" and (loop_backing(d) or "").startswith(W)]
log("verifying tar streams")
ref = bash(f"tar -C {TREE} --sort=name -cf - . | sha256sum").split()[0]
verify, checked = {}, set()
for n, kind, fs, im, opts in READS:  # each image once, through its first configuration
    if im not in checked:
        checked.add(im)
        verify[n] = bash(f"tar -C {mnt[n]} --sort=name -cf - . | sha256sum").split()[0] == ref

pycmd = {n: python_cmd(mnt[n]) for n, *_ in READS}
WL = [
    ("cold tar", True, lambda m: f"tar -C {m} -cf - . | wc -c"),
    ("warm tar", False, lambda m: f"tar -C {m} -cf - . | wc -c"),
    ("cold find+lstat", True, lambda m: f"find {m} -printf '%i %s %T@ %m %u %g\\n' | wc -l"),
    (f"cold {len(rand)} random cat", True, lambda m: f"cd {m} && xargs -d '\\n' -a {W}/rand.list cat | wc -c"),
]
if os.environ.get("LF_PARALLEL"):
    WL.append(("cold 2 parallel readers", True, lambda m: f"cd {m} && find . -type f -print0 | xargs -0 -P 2 -n 64 cat | wc -c"))
if all(pycmd.values()):
    WL += [("cold python import", True, lambda m: python_cmd(m)),
           ("warm python import", False, lambda m: python_cmd(m))]
rd = {n: {w: [] for w, *_ in WL} for n, *_ in READS}
cache = {n: {"growth": [], "img": []} for n, *_ in READS}
for r in range(READ_RUNS):
    for n, kind, fs, im, opts in rotate(READS, r):
        log(f"reads {r + 1}/{READ_RUNS} {n}")
        m = mnt[n]
        for w, is_cold, cmd in WL:
            if is_cold:
                drop_caches()
            c0 = pagecache_kib()
            dt, _ = timed(bash, cmd(m))
            rd[n][w].append(dt)
            if w == "cold tar":
                cache[n]["growth"].append((pagecache_kib() - c0) / 1024)
                cache[n]["img"].append(int(bash(f"fincore -b -n -o RES {img[im]}").split()[0]) / MiB)

out("## 4. Read performance")
out()
out(f"All {len(READS)} configurations mounted at once ({len(ours)} loop devices attached for them, "
    f"{sum(1 for _, k, *_ in READS if k == 'file')} file-backed mounts need none). "
    f"{READ_RUNS} rounds; in each round every configuration runs every workload, configuration order rotated per "
    f"round. Cold = `sync; echo 3 > /proc/sys/vm/drop_caches` right before the command; warm = run again right "
    f"after the cold tar. Times are wall clock of the whole shell pipeline, median (min–max), ms. Workloads: "
    f"tar = `tar -cf - . | wc -c` (not `-f /dev/null`: GNU tar skips reading file data when the archive is "
    f"/dev/null); find+lstat = `find -printf '%i %s %T@ %m %u %g'` of all {sum(counts.values())} entries; random cat = "
    f"`xargs cat` of the fixed {len(rand)}-file list; (LF_PARALLEL=1: 2 parallel readers = `find -type f -print0 | "
    f"xargs -0 -P 2 -n 64 cat`, the whole tree by two cat processes at a time); python import = `PYTHONHOME=<layer>/usr <layer>/usr/bin/python3.X -S -c "
    f"'import json, email.parser, http.client, asyncio, decimal, argparse, logging, sqlite3, ssl, unittest'` "
    f"(the layer's own interpreter, stdlib and .pyc files; shared libraries from the host).")
out()
out("| configuration | " + " | ".join(w for w, *_ in WL) + " |")
out("|---|" + "---:|" * len(WL))
for n, *_ in READS:
    out(f"| {n} | " + " | ".join(fmt_s(rd[n][w]) for w, *_ in WL) + " |")
out()
out("Page cache after one cold full tar (median over rounds; the machine is shared so this is approximate): growth of "
    "Cached+Buffers in /proc/meminfo, and how much of the image file itself is resident (`fincore`). "
    "Tar stream check: `tar --sort=name -cf - .` of the mount, sha256 compared with the same on the source tree "
    "(file data, names, modes, owners, mtimes in seconds, hardlinks).")
out()
out("| configuration | page cache growth MiB | image file resident MiB | image size MiB | tar stream = source |")
out("|---|---:|---:|---:|---|")
for n, kind, fs, im, opts in READS:
    out(f"| {n} | {med(cache[n]['growth']):.0f} | {med(cache[n]['img']):.0f} | {os.stat(img[im]).st_size / MiB:.0f} | "
        f"{('yes' if verify[n] else '**NO**') if n in verify else '(same image, checked above)'} |")
out()
pyc = {}
if all(pycmd.values()):
    pyc = {n: pyc_check(mnt[n]) for n in ("erofs-lz4hc, file-backed", "sqfs-zstd, loop")}
    out("Python start-up .pyc use (from `python -v`): " + "; ".join(
        f"{n}: {u} cached .pyc used, {s} modules compiled from source" for n, (u, s) in pyc.items()) + ".")
    out()
for n, *_ in READS:
    humount(mnt[n], devs[n])

# ----------------------------------------------------------------------------- 5. features
log("features")
FT = f"{W}/ft"
os.makedirs(f"{FT}/opq")
os.makedirs(f"{FT}/d")
OLD = 981173106_123456789  # 2001-02-03 04:05:06.123456789 UTC
FUT = 1893456000_000000000  # 2030-01-01
with open(f"{FT}/reg", "w") as f:
    f.write("hello\n" * 1000)
with open(f"{FT}/opq/inner", "w") as f:
    f.write("x\n")
with open(f"{FT}/future", "w") as f:
    f.write("from the future\n")
os.link(f"{FT}/reg", f"{FT}/hard")
os.symlink("reg", f"{FT}/link")
os.mknod(f"{FT}/wh", 0o20000 | 0o600, os.makedev(0, 0))  # overlayfs whiteout: char 0:0
os.mkfifo(f"{FT}/fifo")
os.setxattr(f"{FT}/opq", "user.overlay.opaque", b"y")
os.setxattr(f"{FT}/opq", "trusted.overlay.opaque", b"y")
open(f"{FT}/xwh", "w").close()  # overlayfs >= 6.7 xattr whiteout: empty file + overlay.whiteout
os.setxattr(f"{FT}/xwh", "user.overlay.whiteout", b"")
os.setxattr(f"{FT}/reg", "user.big", b"v" * 2000)
with open(f"{FT}/suid", "w") as f:
    f.write("#!/bin/sh\n")
os.chown(f"{FT}/suid", 123456, 654321)
os.chmod(f"{FT}/suid", 0o4755)
has_cap = shutil.which("setcap") is not None
if has_cap:
    run(["setcap", "cap_net_raw+ep", f"{FT}/suid"])
    os.chmod(f"{FT}/suid", 0o4755)
for p in ("reg", "opq/inner", "link", "wh", "xwh", "fifo", "suid", "opq", "d", "."):
    os.utime(f"{FT}/{p}", ns=(OLD, OLD), follow_symlinks=False)
os.utime(f"{FT}/future", ns=(FUT, FUT))
os.utime(FT, ns=(OLD, OLD))
src_m = manifest(FT)
FIMG = {
    "erofs (`-zlz4hc --preserve-mtime`)": (["mkfs.erofs", "--quiet", "-zlz4hc", "--preserve-mtime", f"{W}/f1.img", FT], "erofs"),
    "erofs (`-zlz4hc`, no mtime flag)": (["mkfs.erofs", "--quiet", "-zlz4hc", f"{W}/f2.img", FT], "erofs"),
    "squashfs (`-comp zstd`)": (["mksquashfs", FT, f"{W}/f3.img", "-comp", "zstd", "-no-progress", "-quiet", "-noappend"], "squashfs"),
}
KEYS = ["type", "perm", "uid", "gid", "rdev", "size", "nlink", "link", "sha256", "xattrs", "mtime_s", "mtime_ns"]
fres, raw = {}, []
for n, (cmd, fs) in FIMG.items():
    run(cmd, stdout=sp.DEVNULL)
    d = f"{MNT}/f"
    mm = hmount("file" if fs == "erofs" else "loop", fs, cmd[-2] if fs == "erofs" else cmd[2], d)
    fres[n] = diff_manifest(src_m, manifest(d), KEYS)
    raw.append(f"== {n}\n" + sh1(f"cd {d} && getfattr -d -m - -e text --absolute-names opq wh xwh 2>&1; "
                               f"echo reg: user.big is $(getfattr -n user.big --only-values reg | wc -c) bytes; "
                               f"stat -c '%n: %F %t:%T mode %a owner %u:%g mtime %.9Y' wh reg future suid opq") +
               ("\n" + sh1(f"getcap {d}/suid").replace(d + "/", "") if has_cap else ""))
    humount(d, mm["dev"])
out("## 5. Features")
out()
out("A small tree packed and mounted (EROFS file-backed, squashfs via loop), then compared entry by entry with the source "
    "(lstat fields, xattrs by listxattr/getxattr, sha256 of contents). Source: `opq/` with `user.overlay.opaque=y` and "
    "`trusted.overlay.opaque=y`; `wh` = char 0:0 whiteout; `xwh` = empty file with an empty `user.overlay.whiteout` (the xattr whiteout form); `reg` with a 2000-byte `user.big` "
    "xattr and a hardlink `hard`; `suid` owned 123456:654321 mode 4755" + (" with `security.capability` (setcap)" if has_cap else "") +
    "; symlink; fifo; mtimes 2001-02-03 04:05:06.123456789 (ns part on purpose) and one file in 2030.")
out()
out("| property | " + " | ".join(FIMG) + " |")
out("|---|" + "---|" * len(FIMG))
for k in KEYS:
    row = []
    for n in FIMG:
        b = fres[n][k]
        row.append("same" if not b else f"**differs** on {len(b)}: {', '.join(b[:4])}")
    out(f"| {k} | " + " | ".join(row) + " |")
out()
out("Read back with getfattr/stat/getcap:")
out()
out("```")
out("\n".join(raw))
out("```")
out()

# ----------------------------------------------------------------------------- reproducibility
log("reproducibility")
RT = f"{W}/rtree"
run(["cp", "-a", FT, RT])  # keeps hardlinks, owners, xattrs, mtimes
py_in_tree = python_cmd(TREE)
if py_in_tree:
    exe = py_in_tree.split()[1]
    base = os.path.basename(exe)
    run(["cp", "-a", "--parents", f"usr/bin/{base}", f"usr/lib/{base}", RT], cwd=TREE)
os.utime(RT, ns=(OLD, OLD))
rt_m = manifest(RT, content=False)
maxm = max(e["mtime_s"] for e in rt_m.values())
SDE = str(maxm)
TMPFS = f"{W}/tmpfs"
os.makedirs(TMPFS)
run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", TMPFS])
run(["cp", "-a", RT, f"{TMPFS}/rtree"])
RT2 = f"{TMPFS}/rtree"
order_differs = os.listdir(f"{RT}/usr/lib/{base}") != os.listdir(f"{RT2}/usr/lib/{base}") if py_in_tree else None
SQ = ["-comp", "lz4", "-processors", "2", "-no-progress", "-quiet", "-noappend"]
EU = ["-U", UUID]
RV = [
    ("erofs", "`--preserve-mtime` (random uuid)", {}, lambda t, o: ["mkfs.erofs", "--quiet", "-zlz4", "--preserve-mtime", o, t]),
    ("erofs", "`-U <uuid> --preserve-mtime`", {}, lambda t, o: ["mkfs.erofs", "--quiet", "-zlz4", *EU, "--preserve-mtime", o, t]),
    ("erofs", f"`SOURCE_DATE_EPOCH=<newest mtime in tree> -U <uuid> --preserve-mtime`", {"SOURCE_DATE_EPOCH": SDE},
     lambda t, o: ["mkfs.erofs", "--quiet", "-zlz4", *EU, "--preserve-mtime", o, t]),
    ("erofs", "`SOURCE_DATE_EPOCH=2020-01-01 -U <uuid> --preserve-mtime`", {"SOURCE_DATE_EPOCH": "1577836800"},
     lambda t, o: ["mkfs.erofs", "--quiet", "-zlz4", *EU, "--preserve-mtime", o, t]),
    ("erofs", "`-T <newest mtime> -U <uuid> --preserve-mtime`", {},
     lambda t, o: ["mkfs.erofs", "--quiet", "-zlz4", *EU, "-T", SDE, "--preserve-mtime", o, t]),
    ("squashfs", "default", {}, lambda t, o: ["mksquashfs", t, o, *SQ]),
    ("squashfs", "`-mkfs-time <newest mtime>`", {}, lambda t, o: ["mksquashfs", t, o, *SQ, "-mkfs-time", SDE]),
    ("squashfs", "`SOURCE_DATE_EPOCH=<newest mtime in tree>`", {"SOURCE_DATE_EPOCH": SDE}, lambda t, o: ["mksquashfs", t, o, *SQ]),
    ("squashfs", "`-all-time <newest mtime>`", {}, lambda t, o: ["mksquashfs", t, o, *SQ, "-all-time", SDE]),
]
rrows = []
for fs, label, env, cmd in RV:
    shas = []
    for i, t in enumerate((RT, RT, RT2)):
        o = f"{W}/rep{i}.img"
        if os.path.exists(o):
            os.unlink(o)
        if i == 1:
            time.sleep(1.1)  # a different second: build times differ unless pinned
        run(cmd(t, o), stdout=sp.DEVNULL, env={**os.environ, **env})
        shas.append(hashlib.sha256(open(o, "rb").read()).hexdigest())
    d = f"{MNT}/rep"
    mm = hmount("file" if fs == "erofs" else "loop", fs, f"{W}/rep0.img", d)
    got = manifest(d, content=False)
    bad_s = diff_manifest(rt_m, got, ["mtime_s"])["mtime_s"]
    bad_ns = diff_manifest(rt_m, got, ["mtime_ns"])["mtime_ns"]
    u, s = pyc_check(d) if py_in_tree else (None, None)
    humount(d, mm["dev"])
    rrows.append((fs, label, shas[0] == shas[1], shas[0] == shas[2], len(rt_m) - len(bad_s), len(rt_m) - len(bad_ns), u, s))
run(["umount", TMPFS])
out("### Reproducibility and mtimes")
out()
out(f"Tree: the feature tree plus the layer's python ({len(rt_m)} entries, newest mtime {SDE} = "
    f"{time.strftime('%Y-%m-%d', time.gmtime(maxm))} from the 2030 file). Each variant (erofs `-zlz4`, squashfs `-comp lz4 -processors 2`) packed twice from the same "
    f"directory 1.1 s apart, and once from a `cp -a` copy on tmpfs (readdir order "
    f"{'differs from' if order_differs else 'same as'} the ext4 source). Then mounted and compared with the source; "
    f"python start-up run from it with `-v` to count .pyc files accepted (python checks the source mtime in seconds and size).")
out()
out("| format | flags | run 1 = run 2 | = tmpfs copy | mtime (s) kept | mtime (ns) kept | .pyc used | compiled from source |")
out("|---|---|---|---|---:|---:|---:|---:|")
for fs, label, same2, same3, ok_s, ok_ns, u, s in rrows:
    out(f"| {fs} | {label} | {'yes' if same2 else 'no'} | {'yes' if same3 else 'no'} | {ok_s}/{len(rt_m)} | {ok_ns}/{len(rt_m)} | {u} | {s} |")
out()
load = sh1("cut -d' ' -f1-3 /proc/loadavg")
out(f"Load average at end: {load}. Total run time {time.time() - T0:.0f} s.")
log("done")
EOF

set -m  # own process group, so cleanup can stop the driver together with its children
python3 "$WORK/driver.py" &
DRIVER=$!
set +m
wait "$DRIVER"
