//! Layer trees on real filesystems: digests, merged views, diffs and uppers.
//!
//! Whiteouts are device nodes and fixtures set ownership, so most tests need
//! root; they say so and pass without it. Tests that mount overlayfs also skip
//! where the kernel refuses the mount.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use brig_image::tree::{self, Diff, Kind, Metadata};
use brig_image::{ImageError, Progress, Silent};
use rustix::fs::{AtFlags, FileType, Mode, Timestamps, XattrFlags, CWD};
use sha2::{Digest, Sha256};
use tempfile::TempDir;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

macro_rules! require_root {
    () => {
        if !is_root() {
            eprintln!("skipped: needs root (whiteouts, device nodes, ownership)");
            return;
        }
    };
}

/// A tree under construction; paths are relative to its root.
struct Tree {
    root: PathBuf,
}

impl Tree {
    /// A fresh tree at `<parent>/<name>`.
    fn new(parent: &Path, name: &str) -> Tree {
        let root = parent.join(name);
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        Tree { root }
    }

    fn path(&self, rel: impl AsRef<OsStr>) -> PathBuf {
        let rel = Path::new(rel.as_ref());
        if rel.as_os_str().is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }

    fn dir(&self, rel: &str, mode: u32) -> &Self {
        fs::create_dir(self.path(rel)).unwrap();
        self.chmod(rel, mode)
    }

    fn file(&self, rel: impl AsRef<OsStr>, contents: &[u8], mode: u32) -> &Self {
        let path = self.path(rel);
        fs::write(&path, contents).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        self
    }

    fn symlink(&self, rel: &str, target: &str) -> &Self {
        symlink(target, self.path(rel)).unwrap();
        self
    }

    fn node(&self, rel: &str, file_type: FileType, dev: (u32, u32)) -> &Self {
        let dev = rustix::fs::makedev(dev.0, dev.1);
        rustix::fs::mknodat(CWD, self.path(rel), file_type, Mode::from(0o644), dev).unwrap();
        self.chmod(rel, 0o644)
    }

    fn whiteout(&self, rel: &str) -> &Self {
        self.node(rel, FileType::CharacterDevice, (0, 0))
    }

    fn fifo(&self, rel: &str) -> &Self {
        rustix::fs::mkfifoat(CWD, self.path(rel), Mode::from(0o600)).unwrap();
        self.chmod(rel, 0o600)
    }

    fn chmod(&self, rel: &str, mode: u32) -> &Self {
        fs::set_permissions(self.path(rel), fs::Permissions::from_mode(mode)).unwrap();
        self
    }

    fn chown(&self, rel: &str, uid: u32, gid: u32) -> &Self {
        std::os::unix::fs::lchown(self.path(rel), Some(uid), Some(gid)).unwrap();
        self
    }

    fn xattr(&self, rel: &str, name: &str, value: &[u8]) -> &Self {
        rustix::fs::lsetxattr(self.path(rel), name, value, XattrFlags::empty()).unwrap();
        self
    }

    fn opaque(&self, rel: &str) -> &Self {
        self.xattr(rel, tree::OPAQUE_XATTR, b"y")
    }

    fn mtime(&self, rel: impl AsRef<OsStr>, sec: i64, nsec: u32) -> &Self {
        let time = rustix::fs::Timespec {
            tv_sec: sec,
            tv_nsec: nsec.into(),
        };
        let times = Timestamps {
            last_access: time,
            last_modification: time,
        };
        rustix::fs::utimensat(CWD, self.path(rel), &times, AtFlags::SYMLINK_NOFOLLOW).unwrap();
        self
    }

    /// Gives every entry an mtime derived from its path, so that trees built
    /// differently can still be identical; creating entries changes the mtime of
    /// their directory, so this runs after the last change.
    fn stamp_all(&self) -> &Self {
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let path = self.path(&rel);
            if fs::symlink_metadata(&path).unwrap().is_dir() {
                for entry in fs::read_dir(&path).unwrap() {
                    stack.push(rel.join(entry.unwrap().file_name()));
                }
            }
            let seed: i64 = rel
                .as_os_str()
                .as_bytes()
                .iter()
                .map(|&b| i64::from(b))
                .sum();
            let nsec = (seed * 7919 % 1_000_000_000) as u32;
            self.mtime(&rel, 1_600_000_000 + seed * 1000, nsec);
        }
        self
    }

    /// Gives `rels` the mtimes they have in `other`.
    fn same_times_as(&self, other: &Tree, rels: &[&str]) -> &Self {
        for rel in rels {
            let st = fs::symlink_metadata(other.path(rel)).unwrap();
            self.mtime(rel, st.mtime(), st.mtime_nsec() as u32);
        }
        self
    }

    fn digest(&self) -> String {
        tree::digest(&self.root, &Silent).unwrap()
    }
}

/// The tree most digest tests start from: every kind of entry, special mode
/// bits, ownership, xattrs and names that sort differently as bytes and as paths.
fn build_sample(tree: &Tree, reverse: bool) {
    let dirs: [(&str, u32); 7] = [
        ("bin", 0o755),
        ("dev", 0o755),
        ("etc", 0o755),
        ("a", 0o700),
        ("a/b", 0o755),
        ("tmp", 0o1777),
        ("var", 0o755),
    ];
    let mut others: Vec<fn(&Tree)> = vec![
        |t| {
            t.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644);
        },
        |t| {
            t.file("etc/shadow", b"root:*:19000::::::\n", 0o640)
                .chown("etc/shadow", 0, 42);
        },
        |t| {
            t.file("bin/su", b"\x7fELF pretend", 0o4755);
        },
        |t| {
            t.file("bin/wall", b"\x7fELF pretend too", 0o2755)
                .chown("bin/wall", 0, 5);
        },
        |t| {
            t.symlink("etc/localtime", "/usr/share/zoneinfo/UTC");
        },
        |t| {
            t.symlink("bin/sh", "busybox").chown("bin/sh", 3, 4);
        },
        |t| {
            t.node("dev/null", FileType::CharacterDevice, (1, 3));
        },
        |t| {
            t.node("dev/sda", FileType::BlockDevice, (8, 0));
        },
        |t| {
            t.fifo("var/fifo");
        },
        |t| {
            t.whiteout("var/gone");
        },
        |t| {
            t.file("a/b/c", b"", 0o600).chown("a/b/c", 1000, 1000);
        },
        |t| {
            t.file(
                "a-b",
                b"after a/b/c depth first, before a/b as a full path",
                0o644,
            );
        },
        |t| {
            t.file(OsStr::from_bytes(b"caf\xe9 name"), b"latin-1 name", 0o644);
        },
        |t| {
            let listener = std::os::unix::net::UnixListener::bind(t.path("var/sock")).unwrap();
            drop(listener);
            t.chmod("var/sock", 0o755);
        },
    ];
    let mut dirs = dirs.to_vec();
    if reverse {
        others.reverse();
        dirs.reverse();
        dirs.sort_by_key(|(rel, _)| rel.matches('/').count());
    }
    for (rel, mode) in dirs {
        tree.dir(rel, mode);
    }
    for add in others {
        add(tree);
    }
    tree.xattr("etc/passwd", "user.mime_type", b"text/plain")
        .xattr("etc/passwd", "user.empty", b"")
        .xattr("var", "user.note", b"\0binary\xff")
        .opaque("a")
        .stamp_all();
}

#[test]
fn digest_is_stable_across_creation_order_and_copies() {
    require_root!();
    let tmp = TempDir::new().unwrap();
    let forward = Tree::new(tmp.path(), "forward");
    build_sample(&forward, false);
    let backward = Tree::new(tmp.path(), "backward");
    build_sample(&backward, true);
    let expected = forward.digest();
    assert!(expected.starts_with("sha256:"));
    assert_eq!(expected.len(), "sha256:".len() + 64);
    assert!(expected[7..]
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    assert_eq!(backward.digest(), expected);
    assert_eq!(forward.digest(), expected, "digest is repeatable");

    // A copy on another filesystem (tmpfs lists directories in another order
    // than ext4 and has other directory sizes).
    let shm = Path::new("/dev/shm");
    let other = if shm.is_dir() {
        TempDir::new_in(shm).unwrap()
    } else {
        TempDir::new().unwrap()
    };
    let copy = other.path().join("copy");
    let status = Command::new("cp")
        .arg("-a")
        .arg(&forward.root)
        .arg(&copy)
        .status();
    match status {
        Ok(status) if status.success() => {
            assert_eq!(tree::digest(&copy, &Silent).unwrap(), expected);
        }
        _ => eprintln!("skipped the copy: cp -a is not available or failed"),
    }
}

#[test]
fn digest_ignores_hardlink_structure_and_host_xattrs() {
    require_root!();
    let tmp = TempDir::new().unwrap();
    let linked = Tree::new(tmp.path(), "linked");
    linked.file("x", b"same", 0o644);
    fs::hard_link(linked.path("x"), linked.path("y")).unwrap();
    linked.stamp_all().mtime("x", 5, 5);
    let copied = Tree::new(tmp.path(), "copied");
    copied.file("x", b"same", 0o644).file("y", b"same", 0o644);
    copied.stamp_all().mtime("x", 5, 5).mtime("y", 5, 5);
    assert_eq!(linked.digest(), copied.digest());

    // Labels the host assigns (here a made-up security.* name, which root may
    // set where no LSM claims it) and trusted.*, which only root sees, are not
    // content.
    let before = copied.digest();
    for name in ["trusted.brig_test", "security.brig_test"] {
        match rustix::fs::lsetxattr(copied.path("x"), name, b"1", XattrFlags::empty()) {
            Ok(()) => assert_eq!(copied.digest(), before, "{name}"),
            Err(e) => eprintln!("skipped {name}: the kernel refused to set it: {e}"),
        }
    }
}

#[test]
fn digest_changes_with_every_attribute() {
    require_root!();
    type Mutation = fn(&Tree);
    let mutations: &[(&str, Mutation)] = &[
        ("contents", |t| {
            t.file("etc/passwd", b"root:x:0:0:root:/root:/bin/bash", 0o644)
                .stamp_all();
        }),
        ("contents, same size", |t| {
            t.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sx\n", 0o644)
                .stamp_all();
        }),
        ("mode", |t| {
            t.chmod("etc/passwd", 0o600);
        }),
        ("setuid bit", |t| {
            t.chmod("bin/su", 0o755);
        }),
        ("sticky bit", |t| {
            t.chmod("tmp", 0o777);
        }),
        ("uid", |t| {
            t.chown("etc/passwd", 1, 0);
        }),
        ("gid", |t| {
            t.chown("etc/passwd", 0, 1);
        }),
        ("uid of a symlink", |t| {
            t.chown("etc/localtime", 9, 0);
        }),
        ("mtime seconds", |t| {
            let st = fs::symlink_metadata(t.path("etc/passwd")).unwrap();
            t.mtime("etc/passwd", st.mtime() + 1, st.mtime_nsec() as u32);
        }),
        ("mtime nanoseconds", |t| {
            let st = fs::symlink_metadata(t.path("etc/passwd")).unwrap();
            t.mtime("etc/passwd", st.mtime(), st.mtime_nsec() as u32 + 1);
        }),
        ("mtime of the root", |t| {
            t.mtime("", 1, 0);
        }),
        ("xattr value", |t| {
            t.xattr("etc/passwd", "user.mime_type", b"text/plaim");
        }),
        ("xattr name", |t| {
            rustix::fs::lremovexattr(t.path("etc/passwd"), "user.empty").unwrap();
            t.xattr("etc/passwd", "user.emptz", b"");
        }),
        ("xattr added", |t| {
            t.xattr("etc", "user.new", b"");
        }),
        ("xattr removed", |t| {
            rustix::fs::lremovexattr(t.path("etc/passwd"), "user.empty").unwrap();
        }),
        ("opaque removed", |t| {
            rustix::fs::lremovexattr(t.path("a"), tree::OPAQUE_XATTR).unwrap();
        }),
        ("symlink target", |t| {
            fs::remove_file(t.path("bin/sh")).unwrap();
            t.symlink("bin/sh", "busyboy")
                .chown("bin/sh", 3, 4)
                .stamp_all();
        }),
        ("name", |t| {
            fs::rename(t.path("etc/passwd"), t.path("etc/passwe")).unwrap();
            t.stamp_all();
        }),
        ("device number", |t| {
            fs::remove_file(t.path("dev/null")).unwrap();
            t.node("dev/null", FileType::CharacterDevice, (1, 5))
                .stamp_all();
        }),
        ("device kind", |t| {
            fs::remove_file(t.path("dev/null")).unwrap();
            t.node("dev/null", FileType::BlockDevice, (1, 3))
                .stamp_all();
        }),
        ("fifo to file", |t| {
            fs::remove_file(t.path("var/fifo")).unwrap();
            t.file("var/fifo", b"", 0o600).stamp_all();
        }),
        ("whiteout removed", |t| {
            fs::remove_file(t.path("var/gone")).unwrap();
            t.stamp_all();
        }),
        ("empty dir added", |t| {
            t.dir("a/b/d", 0o755).stamp_all();
        }),
    ];
    let tmp = TempDir::new().unwrap();
    let base = Tree::new(tmp.path(), "base");
    build_sample(&base, false);
    let mut seen = BTreeMap::from([(base.digest(), "unchanged")]);
    for (index, (what, mutate)) in mutations.iter().enumerate() {
        let tree = Tree::new(tmp.path(), &format!("m{index}"));
        build_sample(&tree, false);
        mutate(&tree);
        if let Some(earlier) = seen.insert(tree.digest(), what) {
            panic!("changing the {what} gives the same digest as {earlier}");
        }
    }
}

#[test]
fn digest_keeps_field_boundaries() {
    let tmp = TempDir::new().unwrap();
    let digest_of = |name: &str, xattrs: &[(&str, &[u8])]| {
        let tree = Tree::new(tmp.path(), name);
        for (name, value) in xattrs {
            tree.xattr("", name, value);
        }
        tree.mtime("", 1, 1).digest()
    };
    // Shifting bytes from a name to its value, or from one xattr to the next,
    // must not give the same stream.
    assert_ne!(
        digest_of("t1", &[("user.ab", b"c")]),
        digest_of("t2", &[("user.a", b"bc")])
    );
    assert_ne!(
        digest_of("t3", &[("user.a", b"1"), ("user.b", b"2")]),
        digest_of("t4", &[("user.a", b"1user.b2")])
    );
}

/// Recomputes the digest of a small tree exactly as the module docs specify it,
/// so that the documented format and the code cannot drift apart.
#[test]
fn digest_matches_the_documented_serialization() {
    let tmp = TempDir::new().unwrap();
    let tree = Tree::new(tmp.path(), "doc");
    tree.chmod("", 0o755)
        .file("f", b"hello", 0o640)
        .xattr("f", "user.k", b"v")
        .xattr("f", "user.a", b"")
        .symlink("l", "f")
        .dir("d", 0o700)
        .mtime("f", 1000, 5)
        .mtime("l", -2, 999_999_999)
        .mtime("d", 3, 0)
        .mtime("", 7, 0);
    let uid = u64::from(rustix::process::geteuid().as_raw());
    let gid = u64::from(rustix::process::getegid().as_raw());

    fn bytes(out: &mut Vec<u8>, b: &[u8]) {
        out.extend_from_slice(&(b.len() as u64).to_be_bytes());
        out.extend_from_slice(b);
    }
    let common = |out: &mut Vec<u8>, path: &[u8], kind: u8, mode: u64, sec: i64, nsec: u64| {
        bytes(out, path);
        out.push(kind);
        for n in [mode, uid, gid] {
            out.extend_from_slice(&n.to_be_bytes());
        }
        out.extend_from_slice(&sec.to_be_bytes());
        out.extend_from_slice(&nsec.to_be_bytes());
    };
    let mut s = Vec::new();
    bytes(&mut s, b"brig-tree-v1");
    common(&mut s, b"", b'd', 0o755, 7, 0);
    s.extend_from_slice(&0u64.to_be_bytes());
    common(&mut s, b"d", b'd', 0o700, 3, 0);
    s.extend_from_slice(&0u64.to_be_bytes());
    common(&mut s, b"f", b'f', 0o640, 1000, 5);
    s.extend_from_slice(&5u64.to_be_bytes());
    s.extend_from_slice(&Sha256::digest(b"hello"));
    s.extend_from_slice(&2u64.to_be_bytes());
    bytes(&mut s, b"user.a");
    bytes(&mut s, b"");
    bytes(&mut s, b"user.k");
    bytes(&mut s, b"v");
    common(&mut s, b"l", b'l', 0o777, -2, 999_999_999);
    bytes(&mut s, b"f");
    s.extend_from_slice(&0u64.to_be_bytes());

    let expected = format!("sha256:{}", hex::encode(Sha256::digest(&s)));
    assert_eq!(tree.digest(), expected);
}

#[derive(Default)]
struct Counting {
    bytes: AtomicU64,
    cancel: AtomicBool,
}

impl Progress for Counting {
    fn advance(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

#[test]
fn digest_reports_progress_and_stops_when_cancelled() {
    let tmp = TempDir::new().unwrap();
    let tree = Tree::new(tmp.path(), "p");
    tree.dir("d", 0o755)
        .file("d/big", &vec![7; 3 << 20], 0o644)
        .file("small", b"12345", 0o644);
    let progress = Counting::default();
    tree::digest(&tree.root, &progress).unwrap();
    assert_eq!(progress.bytes.load(Ordering::Relaxed), (3 << 20) + 5);

    progress.cancel.store(true, Ordering::Relaxed);
    let err = tree::digest(&tree.root, &progress).unwrap_err();
    assert!(matches!(err, ImageError::Interrupted), "{err}");
}

/// A tree is digested before it is packed: a name a layer cannot hold (erofs-utils
/// 1.5 fails on 255 bytes, with "Could not format the device: [Error 2]") is
/// refused there, naming where it is, unless it is left out.
#[test]
fn digest_refuses_a_name_a_layer_cannot_hold() {
    let tmp = TempDir::new().unwrap();
    let tree = Tree::new(tmp.path(), "n");
    let long = "x".repeat(255);
    tree.dir("d", 0o755).file(format!("d/{long}"), b"", 0o644);
    let err = tree::digest(&tree.root, &Silent).unwrap_err();
    assert!(matches!(err, ImageError::Unsupported(_)), "{err}");
    let message = err.to_string();
    assert!(
        message.starts_with("/d/xxx") && message.contains("a name of 255 bytes"),
        "{message}"
    );
    assert!(!message.contains(&long), "the path is cut: {message}");
    assert!(tree::digest_excluding(&tree.root, &["d".into()], &Silent).is_ok());
    std::fs::rename(
        tree.root.join("d").join(&long),
        tree.root.join("d").join(&long[1..]),
    )
    .unwrap();
    assert!(tree::digest(&tree.root, &Silent).is_ok());
}

#[test]
fn digest_does_not_follow_symlinks() {
    let tmp = TempDir::new().unwrap();
    let outside = tmp.path().join("outside");
    fs::write(&outside, b"secret").unwrap();
    let tree = Tree::new(tmp.path(), "t");
    tree.symlink("link", outside.to_str().unwrap()).stamp_all();
    let before = tree.digest();
    fs::write(&outside, b"changed").unwrap();
    assert_eq!(tree.digest(), before);
}

/// The merged view without sources: what a mount shows.
fn view(layers: &[&Path]) -> BTreeMap<PathBuf, Metadata> {
    tree::merged(layers)
        .unwrap()
        .into_iter()
        .map(|(path, entry)| (path, entry.meta))
        .collect()
}

fn paths<T>(map: &BTreeMap<PathBuf, T>) -> Vec<&str> {
    map.keys().map(|p| p.to_str().unwrap()).collect()
}

/// Three layers exercising every overlay rule, bottom first.
fn build_stack(tmp: &Path) -> [Tree; 3] {
    let l0 = Tree::new(tmp, "l0");
    l0.dir("etc", 0o755)
        .file("etc/a", b"a0", 0o644)
        .file("etc/b", b"b0", 0o644)
        .dir("etc/sub", 0o755)
        .file("etc/sub/x", b"x0", 0o644)
        .dir("usr", 0o755)
        .dir("usr/bin", 0o755)
        .file("usr/bin/tool", b"tool", 0o755)
        .dir("var", 0o755)
        .dir("var/log", 0o755)
        .file("var/log/l1", b"log", 0o644)
        .file("var/keep", b"keep", 0o644)
        .file("opt", b"file under a dir later", 0o644)
        .dir("srv", 0o755)
        .file("srv/s", b"s0", 0o644)
        .stamp_all();
    let l1 = Tree::new(tmp, "l1");
    l1.dir("etc", 0o700)
        .whiteout("etc/a")
        .file("etc/c", b"c1", 0o644)
        .dir("var", 0o750)
        .opaque("var")
        .xattr("var", "user.kept", b"1")
        .file("var/new", b"new", 0o644)
        .dir("usr", 0o755)
        .file("usr/bin", b"a file over a dir", 0o755)
        .dir("opt", 0o755)
        .file("opt/x", b"in a dir over a file", 0o644)
        .whiteout("nothing-below")
        // Ignored by the kernel on a layer's root.
        .opaque("")
        .stamp_all();
    let l2 = Tree::new(tmp, "l2");
    l2.dir("etc", 0o755)
        .whiteout("etc/sub")
        .file("etc/b", b"b2", 0o600)
        .dir("srv", 0o755)
        .file("srv/t", b"t2", 0o644)
        .stamp_all();
    [l0, l1, l2]
}

#[test]
fn merged_view_follows_overlay_rules() {
    require_root!();
    let tmp = TempDir::new().unwrap();
    let [l0, l1, l2] = build_stack(tmp.path());
    let merged = tree::merged(&[&l0.root, &l1.root, &l2.root]).unwrap();
    assert_eq!(
        paths(&merged),
        [
            "/", "/etc", "/etc/b", "/etc/c", "/opt", "/opt/x", "/srv", "/srv/s", "/srv/t", "/usr",
            "/usr/bin", "/var", "/var/new",
        ]
    );
    let at = |p: &str| &merged[Path::new(p)];
    // The uppermost layer with a name decides its metadata and content.
    assert_eq!(
        (at("/").layer, at("/").source.as_path()),
        (2, l2.root.as_path())
    );
    assert_eq!((at("/etc").layer, at("/etc").meta.mode), (2, 0o755));
    assert_eq!((at("/etc/b").layer, at("/etc/b").meta.mode), (2, 0o600));
    assert_eq!(at("/etc/b").source, l2.path("etc/b"));
    assert_eq!((at("/etc/c").layer, at("/srv/s").layer), (1, 0));
    assert_eq!(at("/usr/bin").meta.kind, Kind::File);
    assert_eq!(at("/opt").meta.kind, Kind::Dir);
    // The opaque dir appears with its own metadata, minus the overlay xattr.
    let var = &at("/var").meta;
    assert_eq!((var.mode, at("/var").layer), (0o750, 1));
    assert_eq!(
        var.xattrs
            .keys()
            .map(|k| k.to_str().unwrap())
            .collect::<Vec<_>>(),
        ["user.kept"]
    );
    assert_eq!(at("/etc/b").meta.size, 2);
    assert_eq!(at("/etc").meta.size, 0, "directory sizes are not metadata");

    // Lower stacks on their own.
    assert_eq!(
        paths(&tree::merged(&[&l0.root, &l1.root]).unwrap()),
        [
            "/",
            "/etc",
            "/etc/b",
            "/etc/c",
            "/etc/sub",
            "/etc/sub/x",
            "/opt",
            "/opt/x",
            "/srv",
            "/srv/s",
            "/usr",
            "/usr/bin",
            "/var",
            "/var/new",
        ]
    );
    assert_eq!(tree::merged(&[]).unwrap().len(), 0);
}

#[test]
fn whiteouts_in_the_bottom_layer_are_not_entries() {
    require_root!();
    let tmp = TempDir::new().unwrap();
    let l0 = Tree::new(tmp.path(), "l0");
    l0.whiteout("w").file("f", b"", 0o644);
    assert_eq!(paths(&tree::merged(&[&l0.root]).unwrap()), ["/", "/f"]);
}

/// An overlayfs mount that goes away with the value.
struct Mount(PathBuf);

impl Mount {
    /// Mounts overlayfs at `at` with `options`, `userxattr` added as brig does;
    /// `None`, after saying why, where this kernel or sandbox refuses.
    fn new(options: &str, read_only: bool, at: &Path) -> Option<Mount> {
        fs::create_dir_all(at).unwrap();
        let data = std::ffi::CString::new(format!("{options},userxattr")).unwrap();
        let flags = if read_only {
            rustix::mount::MountFlags::RDONLY
        } else {
            rustix::mount::MountFlags::empty()
        };
        match rustix::mount::mount("overlay", at, "overlay", flags, data.as_c_str()) {
            Ok(()) => Some(Mount(at.to_path_buf())),
            Err(e) => {
                eprintln!("skipped: cannot mount overlayfs here: {e}");
                None
            }
        }
    }

    /// Mounts a stack of layers, bottom first, read-only.
    fn stack(layers: &[&Path], at: &Path) -> Option<Mount> {
        let top_first: Vec<_> = layers.iter().rev().map(|p| p.to_str().unwrap()).collect();
        Mount::new(&format!("lowerdir={}", top_first.join(":")), true, at)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::empty());
    }
}

#[test]
fn merged_view_matches_the_kernel() {
    require_root!();
    let tmp = TempDir::new().unwrap();
    let [l0, l1, l2] = build_stack(tmp.path());
    let stack = [l0.root.as_path(), &l1.root, &l2.root];
    let Some(mount) = Mount::stack(&stack, &tmp.path().join("mnt")) else {
        return;
    };
    // A mount is a single layer without whiteouts: its own merged view is what
    // the kernel shows.
    assert_eq!(view(&stack), view(&[&mount.0]));
}

fn strs(paths: &[PathBuf]) -> Vec<&str> {
    paths.iter().map(|p| p.to_str().unwrap()).collect()
}

#[test]
fn diff_lists_added_changed_and_deleted_paths() {
    require_root!();
    let tmp = TempDir::new().unwrap();
    let base = Tree::new(tmp.path(), "base");
    base.dir("etc", 0o755)
        .file("etc/same", b"same", 0o644)
        .file("etc/content", b"aaaa", 0o644)
        .file("etc/mode", b"m", 0o644)
        .file("etc/old-name", b"renamed", 0o644)
        .file("etc/copied-up", b"untouched", 0o644)
        .dir("d", 0o755)
        .dir("d/e", 0o755)
        .file("d/e/f", b"f", 0o644)
        .symlink("d/link", "e/f")
        .dir("keep", 0o755)
        .file("keep/x", b"x", 0o644)
        .stamp_all();
    let upper = Tree::new(tmp.path(), "upper");
    upper
        .dir("etc", 0o755)
        // Same size and mtime: only the contents tell it apart.
        .file("etc/content", b"bbbb", 0o644)
        .file("etc/copied-up", b"untouched", 0o644)
        .whiteout("etc/old-name")
        .file("etc/new-name", b"renamed", 0o644)
        .whiteout("d")
        .dir("new", 0o755)
        .dir("new/sub", 0o755)
        .file("new/sub/file", b"n", 0o644)
        .file("etc/mode", b"m", 0o600)
        .stamp_all();
    // Copied up unchanged, or with the mode changed only.
    upper.same_times_as(
        &base,
        &["", "etc", "etc/content", "etc/copied-up", "etc/mode"],
    );

    let diff = tree::diff(&[&base.root], &[&base.root, &upper.root]).unwrap();
    assert_eq!(
        strs(&diff.added),
        ["/etc/new-name", "/new", "/new/sub", "/new/sub/file"]
    );
    assert_eq!(strs(&diff.changed), ["/etc/content", "/etc/mode"]);
    assert_eq!(
        strs(&diff.deleted),
        ["/d", "/d/e", "/d/e/f", "/d/link", "/etc/old-name"]
    );

    // And back.
    let back = tree::diff(&[&base.root, &upper.root], &[&base.root]).unwrap();
    assert_eq!(
        back,
        Diff {
            added: diff.deleted.clone(),
            changed: diff.changed.clone(),
            deleted: diff.added.clone(),
        }
    );
    assert!(tree::diff(&[&base.root], &[&base.root]).unwrap().is_empty());
    assert!(
        tree::diff(&[&base.root, &upper.root], &[&base.root, &upper.root])
            .unwrap()
            .is_empty()
    );
}

#[test]
fn diff_of_copies_compares_contents() {
    let tmp = TempDir::new().unwrap();
    let a = Tree::new(tmp.path(), "a");
    a.file("f", b"0123456789", 0o644)
        .file("g", b"same", 0o644)
        .stamp_all();
    let b = Tree::new(tmp.path(), "b");
    b.file("f", b"0123456788", 0o644)
        .file("g", b"same", 0o644)
        .stamp_all();
    let diff = tree::diff(&[&a.root], &[&b.root]).unwrap();
    assert_eq!(
        diff,
        Diff {
            changed: vec!["/f".into()],
            ..Diff::default()
        }
    );
}

#[test]
fn diff_reports_type_changes_with_their_subtrees() {
    let tmp = TempDir::new().unwrap();
    let a = Tree::new(tmp.path(), "a");
    a.dir("x", 0o755)
        .file("x/inner", b"", 0o644)
        .file("y", b"", 0o644)
        .stamp_all();
    let b = Tree::new(tmp.path(), "b");
    b.file("x", b"", 0o755)
        .dir("y", 0o755)
        .file("y/inner", b"", 0o644)
        .stamp_all();
    b.same_times_as(&a, &[""]);
    let diff = tree::diff(&[&a.root], &[&b.root]).unwrap();
    assert_eq!(strs(&diff.added), ["/y/inner"]);
    assert_eq!(strs(&diff.changed), ["/x", "/y"]);
    assert_eq!(strs(&diff.deleted), ["/x/inner"]);
}

fn xattr_names(path: &Path) -> Vec<String> {
    let mut buf = vec![0; 4096];
    let len = rustix::fs::llistxattr(path, &mut buf[..]).unwrap();
    let mut names: Vec<String> = buf[..len]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8(n.to_vec()).unwrap())
        .filter(|n| !n.starts_with("security."))
        .collect();
    names.sort();
    names
}

#[test]
fn clean_upper_strips_private_xattrs_and_keeps_opaque() {
    require_root!();
    let tmp = TempDir::new().unwrap();
    let upper = Tree::new(tmp.path(), "upper");
    upper
        .xattr("", "user.overlay.impure", b"y")
        .dir("d", 0o755)
        .opaque("d")
        .xattr("d", "user.overlay.origin", b"\0handle")
        .xattr("d", "user.overlay.impure", b"y")
        .file("d/f", b"f", 0o644)
        .xattr("d/f", "user.overlay.origin", b"\0handle")
        .xattr("d/f", "user.overlay.nlink", b"U+1")
        .xattr("d/f", "user.overlay.upper", b"\0handle")
        .xattr("d/f", "user.overlay.protattr", b"i")
        .xattr("d/f", "trusted.overlay.origin", b"\0handle")
        .xattr("d/f", "user.mine", b"kept")
        .symlink("d/l", "f")
        .xattr("d/l", "trusted.overlay.origin", b"\0handle")
        .whiteout("gone");
    tree::clean_upper(&upper.root).unwrap();
    assert!(xattr_names(&upper.root).is_empty());
    assert_eq!(xattr_names(&upper.path("d")), ["user.overlay.opaque"]);
    assert_eq!(xattr_names(&upper.path("d/f")), ["user.mine"]);
    assert!(xattr_names(&upper.path("d/l")).is_empty());
    // Idempotent.
    tree::clean_upper(&upper.root).unwrap();
}

#[test]
fn clean_upper_refuses_layers_that_depend_on_their_lowers() {
    require_root!();
    for (name, value) in [
        ("user.overlay.redirect", &b"/elsewhere"[..]),
        ("user.overlay.metacopy", b""),
        ("user.overlay.whiteout", b""),
        ("user.overlay.opaque", b"x"),
    ] {
        let tmp = TempDir::new().unwrap();
        let upper = Tree::new(tmp.path(), "upper");
        upper.dir("d", 0o755).xattr("d", name, value);
        let err = tree::clean_upper(&upper.root).unwrap_err();
        assert_eq!(err.code(), "unsupported", "{name}: {err}");
        assert!(
            err.to_string()
                .contains(&upper.path("d").display().to_string()),
            "{err}"
        );
    }
}

/// A real sandbox session: changes through an overlay mount, then the upper
/// directory cleaned and stacked as a layer shows what the mount showed.
#[test]
fn a_cleaned_upper_is_a_layer_of_what_the_mount_showed() {
    require_root!();
    let tmp = TempDir::new().unwrap();
    let lower = Tree::new(tmp.path(), "lower");
    lower
        .dir("etc", 0o755)
        .file("etc/hosts", b"127.0.0.1 localhost\n", 0o644)
        .file("etc/motd", b"hi\n", 0o644)
        .dir("cache", 0o755)
        .dir("cache/a", 0o755)
        .file("cache/a/1", b"1", 0o644)
        .file("cache/2", b"2", 0o644)
        .stamp_all();
    let (upper, work, mnt) = (
        tmp.path().join("upper"),
        tmp.path().join("work"),
        tmp.path().join("mnt"),
    );
    for dir in [&upper, &work, &mnt] {
        fs::create_dir(dir).unwrap();
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.root.display(),
        upper.display(),
        work.display()
    );
    let Some(mount) = Mount::new(&options, false, &mnt) else {
        return;
    };
    let session = || -> std::io::Result<BTreeMap<PathBuf, Metadata>> {
        fs::remove_file(mnt.join("etc/motd"))?;
        fs::write(mnt.join("etc/hosts"), b"10.0.0.1 db\n")?;
        fs::remove_dir_all(mnt.join("cache"))?;
        fs::create_dir(mnt.join("cache"))?;
        fs::write(mnt.join("cache/fresh"), b"fresh")?;
        fs::rename(mnt.join("etc/hosts"), mnt.join("etc/hosts.new"))?;
        // Copies the directory up, with overlay bookkeeping xattrs.
        std::os::unix::fs::lchown(mnt.join("etc"), Some(1), Some(1))?;
        Ok(view(&[&mnt]))
    };
    let shown = session();
    drop(mount);
    let shown = shown.unwrap();

    let private = |path: &Path| {
        xattr_names(path)
            .into_iter()
            .filter(|name| name.starts_with("user.overlay.") && name != tree::OPAQUE_XATTR)
            .count()
    };
    assert!(
        private(&upper) + private(&upper.join("etc")) > 0,
        "overlayfs left no bookkeeping to clean"
    );
    tree::clean_upper(&upper).unwrap();
    assert_eq!(private(&upper) + private(&upper.join("etc")), 0);
    assert_eq!(xattr_names(&upper.join("cache")), [tree::OPAQUE_XATTR]);
    assert_eq!(view(&[&lower.root, &upper]), shown);
    let diff = tree::diff(&[&lower.root], &[&lower.root, &upper]).unwrap();
    assert_eq!(strs(&diff.added), ["/cache/fresh", "/etc/hosts.new"]);
    assert_eq!(
        strs(&diff.deleted),
        [
            "/cache/2",
            "/cache/a",
            "/cache/a/1",
            "/etc/hosts",
            "/etc/motd"
        ]
    );
    assert!(strs(&diff.changed).contains(&"/etc"), "{diff:?}");
    assert!(tree::digest(&upper, &Silent).is_ok());
}
