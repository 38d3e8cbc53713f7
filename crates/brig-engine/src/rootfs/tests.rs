//! Tests of the rootfs operations: normal behaviour, and attacks that must
//! never read, write, delete or list a canary file outside the root.
//!
//! Most run against a plain temporary directory as the root. `ns` runs
//! against a real `/proc/<pid>/root`: a child in its own mount namespace,
//! chrooted into a tmpfs with a procfs, read-only binds and a read-write
//! bind; it needs root and `unshare`, and is skipped otherwise.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tar::{EntryType, Header};

use super::*;

/// Hooks into the walks, to change the tree at a chosen moment.
pub(crate) mod hooks {
    use std::cell::RefCell;

    type Hook = Box<dyn FnMut(&[u8])>;

    thread_local! {
        static WALKED: RefCell<Option<Hook>> = RefCell::new(None);
        static LISTING: RefCell<Option<Hook>> = RefCell::new(None);
    }

    fn call(hook: &'static std::thread::LocalKey<RefCell<Option<Hook>>>, path: &[u8]) {
        hook.with(|hook| {
            if let Ok(mut hook) = hook.try_borrow_mut() {
                if let Some(hook) = hook.as_mut() {
                    hook(path);
                }
            }
        });
    }

    /// Called by the recursive removal right after it opened a directory.
    pub(crate) fn walked(path: &[u8]) {
        call(&WALKED, path);
    }

    /// Called by the recursive removal before each pass over a directory's
    /// names.
    pub(crate) fn listing(path: &[u8]) {
        call(&LISTING, path);
    }

    pub(crate) fn on_walked(hook: impl FnMut(&[u8]) + 'static) {
        WALKED.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    }

    pub(crate) fn on_listing(hook: impl FnMut(&[u8]) + 'static) {
        LISTING.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    }

    pub(crate) fn clear() {
        WALKED.with(|h| *h.borrow_mut() = None);
        LISTING.with(|h| *h.borrow_mut() = None);
    }
}

const CANARY: &[u8] = b"host data that no sandbox may touch\n";

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The sandbox user's host ids: other ids than the test's when root, so
/// that ownership is visible; the test's own otherwise (chown to oneself).
fn owner() -> (u32, u32) {
    if is_root() {
        (4242, 4343)
    } else {
        (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        )
    }
}

/// A root directory, and beside it on the host a directory with a canary.
struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    canary: PathBuf,
    sandbox: SandboxRoot,
}

fn fixture() -> Fixture {
    let tmp = tempfile::Builder::new()
        .prefix("brig-rootfs-")
        .tempdir()
        .unwrap();
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    fs::create_dir_all(root.join("workspace")).unwrap();
    fs::create_dir(&outside).unwrap();
    for dir in [&root, &root.join("workspace")] {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let canary = outside.join("canary");
    fs::write(&canary, CANARY).unwrap();
    let (uid, gid) = owner();
    let sandbox = SandboxRoot::open(&root, uid, gid).unwrap();
    Fixture {
        _tmp: tmp,
        root,
        outside,
        canary,
        sandbox,
    }
}

impl Fixture {
    fn host(&self, sandbox_path: &str) -> PathBuf {
        self.root.join(sandbox_path.trim_start_matches('/'))
    }

    /// The canary is as it was, alone in its directory.
    fn assert_canary_intact(&self) {
        assert_eq!(fs::read(&self.canary).unwrap(), CANARY);
        let names: Vec<_> = fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["canary"]);
        assert_eq!(
            fs::metadata(&self.canary).unwrap().mode() & 0o7777,
            0o644,
            "canary mode changed"
        );
    }

    fn write(&self, path: &str, data: &[u8]) -> Result<u64, RootfsError> {
        let mut writer = self.sandbox.create_write(path, true)?;
        writer.write_chunk(data)?;
        writer.commit()
    }

    fn read(&self, path: &str) -> Result<Vec<u8>, RootfsError> {
        let (mut file, _) = self.sandbox.open_read(path)?;
        let mut data = Vec::new();
        file.read_to_end(&mut data).unwrap();
        Ok(data)
    }

    /// Names in a host directory of the fixture, sorted.
    fn names(&self, sandbox_path: &str) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(self.host(sandbox_path))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

fn canary_host_path(f: &Fixture) -> String {
    f.canary.to_str().unwrap().to_string()
}

macro_rules! assert_err {
    ($result:expr, $variant:ident) => {
        match $result {
            Err(RootfsError::$variant(message)) => message,
            other => panic!(
                "expected {}, got {:?}",
                stringify!($variant),
                other.map(|_| ())
            ),
        }
    };
}

// ---- normal behaviour ----------------------------------------------------

#[test]
fn write_read_round_trip_with_owner_and_modes() {
    let f = fixture();
    let size = f.write("/workspace/a/b/hello.txt", b"hello").unwrap();
    assert_eq!(size, 5);
    let (mut file, stat) = f.sandbox.open_read("/workspace/a/b/hello.txt").unwrap();
    let mut data = String::new();
    file.read_to_string(&mut data).unwrap();
    assert_eq!(data, "hello");
    assert_eq!(stat.size_bytes, 5);
    assert_eq!(stat.mode, 0o644);
    let (uid, gid) = owner();
    let meta = fs::metadata(f.host("/workspace/a/b/hello.txt")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (uid, gid, 0o644)
    );
    for dir in ["/workspace/a", "/workspace/a/b"] {
        let meta = fs::metadata(f.host(dir)).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (uid, gid, 0o755)
        );
    }
    // An explicit mode, set-id bits dropped.
    let mut w = f
        .sandbox
        .create_write_mode("/workspace/run.sh", false, 0o6755)
        .unwrap();
    w.write_all(b"#!/bin/sh\n").unwrap();
    w.commit().unwrap();
    let meta = fs::metadata(f.host("/workspace/run.sh")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o755);
    f.assert_canary_intact();
}

#[test]
fn missing_parent_is_not_created_without_make_parents() {
    let f = fixture();
    assert_err!(
        f.sandbox.create_write("/workspace/missing/x", false),
        NotFound
    );
    assert!(!f.host("/workspace/missing").exists());
    assert_err!(f.sandbox.create_write("/workspace", false), NotAFile);
    assert_err!(f.sandbox.create_write("/", true), NotAFile);
}

#[test]
fn replace_is_atomic_and_uncommitted_writers_leave_nothing() {
    let f = fixture();
    f.write("/workspace/f", b"old").unwrap();
    let before = fs::metadata(f.host("/workspace/f")).unwrap().ino();
    let mut writer = f.sandbox.create_write("/workspace/f", false).unwrap();
    writer.write_chunk(b"new content").unwrap();
    // Until commit, readers see the old file whole.
    assert_eq!(f.read("/workspace/f").unwrap(), b"old");
    assert_eq!(writer.commit().unwrap(), 11);
    assert_eq!(f.read("/workspace/f").unwrap(), b"new content");
    assert_ne!(fs::metadata(f.host("/workspace/f")).unwrap().ino(), before);

    let mut abandoned = f.sandbox.create_write("/workspace/f", false).unwrap();
    abandoned.write_chunk(b"half").unwrap();
    assert_eq!(f.names("/workspace").len(), 2, "the temporary file exists");
    drop(abandoned);
    assert_eq!(f.names("/workspace"), ["f"]);
    assert_eq!(f.read("/workspace/f").unwrap(), b"new content");
}

#[test]
fn writes_into_a_directory_or_mount_are_refused_at_commit_too() {
    let f = fixture();
    let writer = f.sandbox.create_write("/workspace/later", false).unwrap();
    // The sandbox makes a directory at the name meanwhile.
    fs::create_dir(f.host("/workspace/later")).unwrap();
    assert_err!(writer.commit(), NotAFile);
    assert_eq!(f.names("/workspace"), ["later"]);
    assert!(f.host("/workspace/later").is_dir());
}

#[test]
fn list_dir_sorted_with_kinds() {
    let f = fixture();
    f.write("/workspace/b.txt", b"12345").unwrap();
    f.sandbox.mkdir_all("/workspace/a-dir").unwrap();
    symlink("b.txt", f.host("/workspace/c-link")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.host("/workspace/d-fifo"),
        FileType::Fifo,
        Mode::from_bits_truncate(0o600),
        0,
    )
    .unwrap();
    let entries = f.sandbox.list_dir("/workspace").unwrap();
    let summary: Vec<_> = entries
        .iter()
        .map(|e| (e.name.as_str(), e.kind, e.size_bytes, e.mode))
        .collect();
    assert_eq!(
        summary,
        [
            ("a-dir", EntryKind::Directory, entries[0].size_bytes, 0o755),
            ("b.txt", EntryKind::File, 5, 0o644),
            ("c-link", EntryKind::Symlink, 5, 0o777),
            ("d-fifo", EntryKind::Other, 0, 0o600),
        ]
    );
    assert!(entries[1].modified > 1_600_000_000);
    assert_eq!(EntryKind::Directory.as_str(), "directory");
    // Reading a fifo neither hangs nor succeeds.
    assert_err!(f.sandbox.open_read("/workspace/d-fifo"), NotAFile);
    assert_err!(f.sandbox.open_read("/workspace/a-dir"), NotAFile);
    assert_err!(f.sandbox.list_dir("/workspace/b.txt"), NotADirectory);
    assert_err!(f.sandbox.list_dir("/workspace/nope"), NotFound);
}

#[test]
fn mkdir_all_like_mkdir_p() {
    let f = fixture();
    f.sandbox.mkdir_all("/workspace/x/y/z").unwrap();
    f.sandbox.mkdir_all("/workspace/x/y/z/").unwrap();
    f.sandbox.mkdir_all("/workspace/x/../w/./v").unwrap();
    assert!(f.host("/workspace/x/y/z").is_dir());
    assert!(f.host("/workspace/w/v").is_dir());
    let (uid, gid) = owner();
    let meta = fs::metadata(f.host("/workspace/x/y/z")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (uid, gid, 0o755)
    );
    // Through a symlink inside the root.
    symlink("/workspace/x", f.host("/workspace/lx")).unwrap();
    f.sandbox.mkdir_all("/workspace/lx/new").unwrap();
    assert!(f.host("/workspace/x/new").is_dir());
    // A file in the way; a dangling symlink in the way.
    f.write("/workspace/file", b"").unwrap();
    assert_err!(f.sandbox.mkdir_all("/workspace/file/sub"), NotADirectory);
    assert_err!(f.sandbox.mkdir_all("/workspace/file"), NotADirectory);
    symlink("/nowhere", f.host("/workspace/dangling")).unwrap();
    assert_err!(
        f.sandbox.mkdir_all("/workspace/dangling/sub"),
        AlreadyExists
    );
    assert!(!f.host("/nowhere").exists());
    f.sandbox.mkdir_all("/").unwrap();
}

#[test]
fn remove_rules() {
    let f = fixture();
    f.write("/workspace/d/e/f", b"x").unwrap();
    assert_err!(f.sandbox.remove("/workspace/d", false), NotEmpty);
    assert_err!(f.sandbox.remove("/workspace/nope", false), NotFound);
    assert_err!(f.sandbox.remove("/", true), InvalidPath);
    assert_err!(f.sandbox.remove("//", true), InvalidPath);
    assert_err!(f.sandbox.remove("/workspace/..", true), InvalidPath);
    assert_err!(f.sandbox.remove("/workspace/.", true), InvalidPath);
    f.sandbox.remove("/workspace/d/e/f", false).unwrap();
    f.sandbox.remove("/workspace/d/e/", false).unwrap();
    f.write("/workspace/d/e/f", b"x").unwrap();
    f.sandbox.remove("/workspace/d", true).unwrap();
    assert_eq!(f.names("/workspace"), Vec::<String>::new());
}

#[test]
fn invalid_paths_are_refused_everywhere() {
    let f = fixture();
    for bad in ["", "workspace/x", "/a\0b"] {
        assert_err!(f.sandbox.open_read(bad), InvalidPath);
        assert_err!(f.sandbox.create_write(bad, true), InvalidPath);
        assert_err!(f.sandbox.list_dir(bad), InvalidPath);
        assert_err!(f.sandbox.mkdir_all(bad), InvalidPath);
        assert_err!(f.sandbox.remove(bad, true), InvalidPath);
        assert_err!(f.sandbox.write_tar(bad, Vec::new()), InvalidPath);
        assert_err!(
            f.sandbox.extract_tar(bad, std::io::empty(), limits()),
            InvalidPath
        );
    }
    let long = format!("/{}", "a/".repeat(3000));
    assert_err!(f.sandbox.mkdir_all(&long), InvalidPath);
    let long_name = format!("/workspace/{}", "n".repeat(300));
    assert_err!(f.sandbox.create_write(&long_name, false), InvalidPath);
}

#[test]
fn error_codes_and_statuses() {
    let cases = [
        (RootfsError::NotFound(String::new()), "no_such_file"),
        (RootfsError::InvalidPath(String::new()), "invalid_path"),
        (RootfsError::Escapes(String::new()), "path_escapes"),
        (RootfsError::NotEmpty(String::new()), "not_empty"),
        (RootfsError::TooLarge(String::new()), "payload_too_large"),
        (RootfsError::NoSpace(String::new()), "no_space"),
        (RootfsError::ReadOnly(String::new()), "read_only"),
    ];
    // Which status each code is answered with is the front ends' business.
    for (error, code) in cases {
        assert_eq!(error.code().as_str(), code);
    }
    let io = RootfsError::io("doing", std::io::Error::other("boom"));
    assert_eq!(io.code(), crate::fault::ErrorCode::Internal);
    assert_eq!(io.to_string(), "doing: boom");
}

#[test]
fn no_space_is_typed() {
    // /dev/full fails every write with ENOSPC.
    let full = fs::OpenOptions::new().write(true).open("/dev/full");
    let Ok(mut full) = full else {
        return;
    };
    let e = full.write_all(b"x").unwrap_err();
    assert!(matches!(
        error::io_error(e, "writing", "/workspace/x"),
        RootfsError::NoSpace(_)
    ));
}

#[test]
fn create_file_is_always_new() {
    let f = fixture();
    let mut file = f
        .sandbox
        .create_file("/workspace/out/job.out", true)
        .unwrap();
    file.write_all(b"output").unwrap();
    drop(file);
    assert_eq!(
        fs::read(f.host("/workspace/out/job.out")).unwrap(),
        b"output"
    );
    let (uid, gid) = owner();
    let meta = fs::metadata(f.host("/workspace/out/job.out")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (uid, gid, 0o644)
    );
    assert_err!(
        f.sandbox.create_file("/workspace/out/job.out", false),
        AlreadyExists
    );
    symlink(canary_host_path(&f), f.host("/workspace/out/link")).unwrap();
    assert_err!(
        f.sandbox.create_file("/workspace/out/link", false),
        AlreadyExists
    );
    assert_err!(f.sandbox.create_file("/workspace/none/x", false), NotFound);
    symlink("/", f.host("/workspace/root-link")).unwrap();
    f.sandbox
        .create_file("/workspace/root-link/created", false)
        .unwrap();
    assert!(f.host("/created").is_file());
    f.assert_canary_intact();
}

#[test]
fn rename_acts_on_last_components() {
    let f = fixture();
    let canary = canary_host_path(&f);
    let outside = f.outside.to_str().unwrap().to_string();
    f.write("/workspace/a", b"a").unwrap();
    f.sandbox.rename("/workspace/a", "/workspace/b").unwrap();
    assert_eq!(f.names("/workspace"), ["b"]);
    // Over a symlink: the link is replaced, its target untouched.
    symlink(&canary, f.host("/workspace/link")).unwrap();
    f.sandbox.rename("/workspace/b", "/workspace/link").unwrap();
    assert_eq!(fs::read(f.host("/workspace/link")).unwrap(), b"a");
    // A symlink is moved itself.
    symlink(&outside, f.host("/workspace/dir-link")).unwrap();
    f.sandbox
        .rename("/workspace/dir-link", "/workspace/moved-link")
        .unwrap();
    assert_eq!(
        fs::read_link(f.host("/workspace/moved-link")).unwrap(),
        Path::new(&outside)
    );
    // Through a symlinked parent: inside the root.
    symlink("/", f.host("/workspace/root-link")).unwrap();
    f.sandbox
        .rename("/workspace/link", "/workspace/root-link/top")
        .unwrap();
    assert_eq!(fs::read(f.host("/top")).unwrap(), b"a");
    assert_err!(
        f.sandbox
            .rename("/workspace/moved-link/canary", "/workspace/stolen"),
        NotFound
    );
    // Refusals.
    assert_err!(f.sandbox.rename("/", "/workspace/x"), InvalidPath);
    assert_err!(f.sandbox.rename("/top", "/workspace/.."), InvalidPath);
    assert_err!(f.sandbox.rename("/missing", "/workspace/x"), NotFound);
    f.sandbox.mkdir_all("/workspace/d/e").unwrap();
    assert_err!(
        f.sandbox.rename("/workspace/d", "/workspace/d/e/f"),
        InvalidPath
    );
    assert_err!(f.sandbox.rename("/top", "/workspace/d"), NotAFile);
    assert_err!(f.sandbox.rename("/workspace/d/e", "/top"), NotADirectory);
    f.assert_canary_intact();
}

// ---- symlinks and `..` -----------------------------------------------------

#[test]
fn directory_symlink_to_root_keeps_writes_inside() {
    let f = fixture();
    symlink("/", f.host("/workspace/link")).unwrap();
    let unique = format!(
        "brig-rootfs-test-{}",
        f.root
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
    );
    let path = format!("/workspace/link/etc/{unique}");
    f.write(&path, b"inside").unwrap();
    assert_eq!(
        fs::read(f.host(&format!("/etc/{unique}"))).unwrap(),
        b"inside"
    );
    assert!(!Path::new("/etc").join(&unique).exists());
    assert_eq!(f.read(&path).unwrap(), b"inside");
    f.sandbox.remove(&path, false).unwrap();
    assert!(!f.host(&format!("/etc/{unique}")).exists());
    f.assert_canary_intact();
}

#[test]
fn relative_and_absolute_symlinks_to_the_host_resolve_inside() {
    let f = fixture();
    let canary = canary_host_path(&f);
    let outside = f.outside.to_str().unwrap().to_string();
    symlink("../../../../../../outside", f.host("/workspace/rel")).unwrap();
    symlink(&outside, f.host("/workspace/abs")).unwrap();
    symlink(&canary, f.host("/workspace/abs-file")).unwrap();

    // Nothing of the host is seen through them.
    assert_err!(f.read("/workspace/rel/canary"), NotFound);
    assert_err!(f.read("/workspace/abs/canary"), NotFound);
    assert_err!(f.read("/workspace/abs-file"), NotFound);
    assert_err!(f.sandbox.list_dir("/workspace/rel"), NotFound);
    assert_err!(f.sandbox.list_dir("/workspace/abs"), NotFound);
    assert_err!(f.sandbox.remove("/workspace/abs/canary", false), NotFound);
    assert_err!(f.sandbox.remove("/workspace/rel/canary", true), NotFound);
    assert_err!(f.sandbox.write_tar("/workspace/abs", Vec::new()), NotFound);

    // Dangling inside the root, they are in the way of `mkdir -p`.
    assert_err!(f.write("/workspace/rel/canary", b"rel"), AlreadyExists);
    assert!(!f.host("/outside").exists());
    // Once their targets exist inside the root, writes land there.
    f.sandbox.mkdir_all("/outside").unwrap();
    f.sandbox.mkdir_all(&outside).unwrap();
    f.write("/workspace/rel/canary", b"rel").unwrap();
    assert_eq!(fs::read(f.host("/outside/canary")).unwrap(), b"rel");
    f.write("/workspace/abs/canary", b"abs").unwrap();
    assert_eq!(
        fs::read(f.host(&format!("{outside}/canary"))).unwrap(),
        b"abs"
    );
    let listed = f.sandbox.list_dir("/workspace/abs").unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].size_bytes, 3);
    f.sandbox.remove("/workspace/abs/canary", false).unwrap();
    f.assert_canary_intact();
}

#[test]
fn dotdot_chains_stop_at_the_root() {
    let f = fixture();
    let canary = canary_host_path(&f);
    let climb = "/..".repeat(20);
    assert_err!(f.read(&format!("{climb}{canary}")), NotFound);
    assert_err!(f.read(&format!("/workspace/../../..{canary}")), NotFound);
    let listed = f.sandbox.list_dir(&format!("/workspace{climb}")).unwrap();
    assert_eq!(
        listed.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["workspace"]
    );
    f.write(&format!("{climb}/workspace/x"), b"x").unwrap();
    assert_eq!(fs::read(f.host("/workspace/x")).unwrap(), b"x");
    f.write(&format!("/workspace{climb}/outside/canary"), b"in")
        .unwrap();
    assert_eq!(fs::read(f.host("/outside/canary")).unwrap(), b"in");
    f.sandbox
        .remove(&format!("/workspace{climb}/outside"), true)
        .unwrap();
    assert!(!f.host("/outside").exists());
    assert_err!(
        f.sandbox.remove(&format!("/workspace{climb}"), true),
        InvalidPath
    );
    f.sandbox.mkdir_all(&format!("{climb}/made")).unwrap();
    assert!(f.host("/made").is_dir());
    f.assert_canary_intact();
}

#[test]
fn final_symlink_is_replaced_by_a_write_never_written_through() {
    let f = fixture();
    let canary = canary_host_path(&f);
    symlink(&canary, f.host("/workspace/abs")).unwrap();
    symlink("../../../../../outside/canary", f.host("/workspace/rel")).unwrap();
    f.write("/workspace/inside", b"inside").unwrap();
    symlink("inside", f.host("/workspace/to-inside")).unwrap();
    for name in ["abs", "rel", "to-inside"] {
        let path = format!("/workspace/{name}");
        f.write(&path, b"replaced").unwrap();
        let meta = fs::symlink_metadata(f.host(&path)).unwrap();
        assert!(meta.file_type().is_file(), "{name} is now a file");
        assert_eq!(fs::read(f.host(&path)).unwrap(), b"replaced");
    }
    assert_eq!(fs::read(f.host("/workspace/inside")).unwrap(), b"inside");
    f.assert_canary_intact();
}

#[test]
fn final_symlink_is_removed_not_followed() {
    let f = fixture();
    let outside = f.outside.to_str().unwrap().to_string();
    symlink(&outside, f.host("/workspace/abs-dir")).unwrap();
    symlink(canary_host_path(&f), f.host("/workspace/abs-file")).unwrap();
    f.sandbox.mkdir_all("/workspace/keep").unwrap();
    f.write("/workspace/keep/file", b"k").unwrap();
    symlink("keep", f.host("/workspace/to-keep")).unwrap();
    f.sandbox.remove("/workspace/abs-dir", true).unwrap();
    f.sandbox.remove("/workspace/abs-file", false).unwrap();
    f.sandbox.remove("/workspace/to-keep", true).unwrap();
    assert_eq!(f.names("/workspace"), ["keep"]);
    assert_eq!(fs::read(f.host("/workspace/keep/file")).unwrap(), b"k");
    // A trailing slash does not make it follow either.
    symlink("keep", f.host("/workspace/to-keep")).unwrap();
    f.sandbox.remove("/workspace/to-keep/", true).unwrap();
    assert_eq!(f.names("/workspace"), ["keep"]);
    assert_eq!(f.names("/workspace/keep"), ["file"]);
    f.assert_canary_intact();
}

#[test]
fn reads_follow_symlinks_within_the_root_only() {
    let f = fixture();
    f.write("/data/file", b"data").unwrap();
    symlink("/data/file", f.host("/workspace/abs")).unwrap();
    symlink("../data/file", f.host("/workspace/rel")).unwrap();
    symlink("rel", f.host("/workspace/chain")).unwrap();
    symlink("/workspace/../../../data/./file", f.host("/workspace/dots")).unwrap();
    symlink("/data", f.host("/workspace/dir")).unwrap();
    symlink("loop-b", f.host("/workspace/loop-a")).unwrap();
    symlink("loop-a", f.host("/workspace/loop-b")).unwrap();
    for path in [
        "/workspace/abs",
        "/workspace/rel",
        "/workspace/chain",
        "/workspace/dots",
        "/workspace/dir/file",
        "/workspace/dir/../data/file",
    ] {
        assert_eq!(f.read(path).unwrap(), b"data", "{path}");
    }
    assert_err!(f.read("/workspace/dir"), NotAFile);
    assert_err!(f.read("/workspace/dir/"), NotAFile);
    assert_err!(f.read("/workspace/abs/"), NotADirectory);
    assert_err!(f.read("/workspace/loop-a"), Escapes);
    assert_err!(f.read("/workspace/loop-a/x"), Escapes);
    assert_eq!(
        f.sandbox.list_dir("/workspace/dir").unwrap()[0].name,
        "file"
    );
    f.assert_canary_intact();
}

#[test]
fn recursive_remove_never_follows_symlinks() {
    let f = fixture();
    let outside = f.outside.to_str().unwrap().to_string();
    f.write("/workspace/t/a/f", b"").unwrap();
    symlink(&outside, f.host("/workspace/t/a/out-abs")).unwrap();
    symlink("../../../../../../outside", f.host("/workspace/t/out-rel")).unwrap();
    symlink(canary_host_path(&f), f.host("/workspace/t/canary")).unwrap();
    f.sandbox.remove("/workspace/t", true).unwrap();
    assert_eq!(f.names("/workspace"), Vec::<String>::new());
    f.assert_canary_intact();
}

#[test]
fn recursive_remove_holds_descriptors_when_a_directory_is_swapped() {
    let f = fixture();
    let outside = f.outside.to_str().unwrap().to_string();
    f.write("/workspace/t/sub/a", b"a").unwrap();
    f.write("/workspace/t/sub/deeper/b", b"b").unwrap();
    // Once the walk has opened /workspace/t/sub, the sandbox moves that
    // directory away and puts a symlink to the host directory in its place.
    let sub = f.host("/workspace/t/sub");
    let moved = f.host("/workspace/moved");
    let target = outside.clone();
    hooks::on_walked(move |path| {
        if path == b"/workspace/t/sub" {
            fs::rename(&sub, &moved).unwrap();
            symlink(&target, &sub).unwrap();
        }
    });
    let result = f.sandbox.remove("/workspace/t", true);
    hooks::clear();
    result.unwrap();
    // The walk emptied the directory it had opened (now at /workspace/moved),
    // then removed the symlink without following it.
    assert!(!f.host("/workspace/t").exists());
    assert_eq!(f.names("/workspace"), ["moved"]);
    assert_eq!(f.names("/workspace/moved"), Vec::<String>::new());
    f.assert_canary_intact();
}

#[test]
fn recursive_remove_gives_up_when_the_sandbox_refills_faster_than_it_empties() {
    let f = fixture();
    f.write("/workspace/t/seed", b"").unwrap();
    // The sandbox adds names before every batch of removals, as fast as they go; it
    // would go on for ever (the hook stops after more than the budget, so the
    // removal without one ends, and succeeds).
    let dir = f.host("/workspace/t");
    let mut rounds = 0;
    hooks::on_listing(move |path| {
        if path == b"/workspace/t" && rounds < 10 {
            rounds += 1;
            for i in 0..1_000 {
                fs::write(dir.join(format!("{rounds}-{i}")), b"").unwrap();
            }
        }
    });
    let result = f.sandbox.remove("/workspace/t", true);
    hooks::clear();
    assert_err!(result, NotEmpty);
    // Nothing outside the tree was touched, and it can be removed once quiet.
    f.sandbox.remove("/workspace/t", true).unwrap();
    assert_eq!(f.names("/workspace"), Vec::<String>::new());
    f.assert_canary_intact();
}

/// A directory of many buffers' worth of long names, nested: every walk sees
/// each name exactly once.
#[test]
fn walks_see_every_name_of_directories_larger_than_their_buffer() {
    const NAMES: usize = 2_000;
    let f = fixture();
    let long = |i: usize| format!("{i:04}{}", "x".repeat(200));
    for dir in ["/workspace/big", "/workspace/big/inner"] {
        fs::create_dir_all(f.host(dir)).unwrap();
        for i in 0..NAMES {
            fs::write(f.host(&format!("{dir}/{}", long(i))), b"ab").unwrap();
        }
    }

    let mut archive = Vec::new();
    f.sandbox.write_tar("/workspace/big", &mut archive).unwrap();
    let names = tar_names(&archive);
    let unique: std::collections::BTreeSet<_> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "a name archived twice");
    assert_eq!(names.len(), 2 * NAMES + 1);
    assert!(names.contains(&format!("inner/{}", long(NAMES - 1))));

    f.sandbox.remove("/workspace/big", true).unwrap();
    assert_eq!(f.names("/workspace"), Vec::<String>::new());
    f.assert_canary_intact();
}

/// The walks recurse once per level: as deep as they go, they fit the 2 MiB
/// stack of the daemon's blocking threads (tokio's default), in a debug build.
#[test]
fn walks_as_deep_as_allowed_fit_a_blocking_threads_stack() {
    let f = fixture();
    let deep = format!("/workspace/t{}", "/d".repeat(MAX_DEPTH - 2));
    fs::create_dir_all(f.host(&deep)).unwrap();
    fs::write(f.host(&format!("{deep}/f")), b"abc").unwrap();
    let root = f.root.clone();
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let sandbox = SandboxRoot::open(&root, owner().0, owner().1).unwrap();
            let mut archive = Vec::new();
            sandbox.write_tar("/workspace/t", &mut archive).unwrap();
            sandbox.remove("/workspace/t", true).unwrap();
            tar_names(&archive).len()
        })
        .unwrap()
        .join()
        .map(|entries| assert_eq!(entries, MAX_DEPTH - 1))
        .unwrap();
    assert_eq!(f.names("/workspace"), Vec::<String>::new());
}

// ---- reads as the sandbox's user -------------------------------------------

#[test]
fn reads_need_the_sandbox_users_permissions() {
    if !is_root() {
        eprintln!("skipped: needs root to own files as someone else");
        return;
    }
    let f = fixture();
    fs::write(f.host("/secret"), b"root only").unwrap();
    fs::set_permissions(f.host("/secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::create_dir(f.host("/private")).unwrap();
    fs::set_permissions(f.host("/private"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(f.host("/private/open"), b"world readable").unwrap();
    fs::set_permissions(f.host("/private/open"), fs::Permissions::from_mode(0o644)).unwrap();
    symlink("/private/open", f.host("/workspace/via-link")).unwrap();
    // Group bits apply to the sandbox's gid.
    fs::write(f.host("/group"), b"group readable").unwrap();
    fs::set_permissions(f.host("/group"), fs::Permissions::from_mode(0o640)).unwrap();
    rustix::fs::chown(f.host("/group"), None, Some(Gid::from_raw(owner().1))).unwrap();

    assert_err!(f.read("/secret"), PermissionDenied);
    assert_err!(f.read("/private/open"), PermissionDenied);
    assert_err!(f.read("/workspace/via-link"), PermissionDenied);
    assert_err!(f.sandbox.list_dir("/private"), PermissionDenied);
    assert_err!(
        f.sandbox.write_tar("/private", Vec::new()),
        PermissionDenied
    );
    assert_eq!(f.read("/group").unwrap(), b"group readable");

    // The sandbox's own files are readable whatever their mode: it could
    // chmod them.
    f.write("/workspace/mine", b"mine").unwrap();
    fs::set_permissions(f.host("/workspace/mine"), fs::Permissions::from_mode(0o000)).unwrap();
    assert_eq!(f.read("/workspace/mine").unwrap(), b"mine");

    // An archive of / leaves out what the user could not read.
    let mut out = Vec::new();
    f.sandbox.write_tar("/", &mut out).unwrap();
    let names = tar_names(&out);
    assert!(names.contains(&"group".to_string()), "{names:?}");
    assert!(names.contains(&"workspace/mine".to_string()), "{names:?}");
    assert!(
        !names
            .iter()
            .any(|n| n.contains("secret") || n.contains("private")),
        "{names:?}"
    );
}

// ---- archives ----------------------------------------------------------------

fn limits() -> ExtractLimits {
    ExtractLimits {
        max_bytes: 1 << 30,
        max_entries: 10_000,
    }
}

fn tar_names(archive: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    for entry in tar::Archive::new(archive).entries().unwrap() {
        let entry = entry.unwrap();
        names.push(String::from_utf8_lossy(&entry.path_bytes()).into_owned());
    }
    names
}

/// One entry of a hand-made archive: the tar crate's builder refuses the
/// hostile names these tests need.
struct Raw<'a> {
    name: &'a [u8],
    kind: EntryType,
    data: &'a [u8],
    link: &'a [u8],
    size: Option<u64>,
}

fn raw(name: &str, kind: EntryType) -> Raw<'_> {
    Raw {
        name: name.as_bytes(),
        kind,
        data: b"",
        link: b"",
        size: None,
    }
}

impl<'a> Raw<'a> {
    fn data(mut self, data: &'a [u8]) -> Self {
        self.data = data;
        self
    }
    fn link(mut self, link: &'a str) -> Self {
        self.link = link.as_bytes();
        self
    }
}

fn raw_tar(entries: &[Raw<'_>], end: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in entries {
        let mut header = Header::new_gnu();
        header.as_old_mut().name[..entry.name.len()].copy_from_slice(entry.name);
        header.as_old_mut().linkname[..entry.link.len()].copy_from_slice(entry.link);
        header.set_entry_type(entry.kind);
        header.set_mode(0o644);
        header.set_mtime(1_700_000_000);
        header.set_size(entry.size.unwrap_or(entry.data.len() as u64));
        header.set_cksum();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(entry.data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    if end {
        out.resize(out.len() + 1024, 0);
    }
    out
}

#[test]
fn archive_round_trip() {
    let f = fixture();
    let outside = f.outside.to_str().unwrap().to_string();
    f.write("/workspace/src/a.txt", b"alpha").unwrap();
    f.write("/workspace/src/sub/b.bin", &[0u8, 1, 2, 255])
        .unwrap();
    f.sandbox.mkdir_all("/workspace/src/empty").unwrap();
    let long_name = "n".repeat(150);
    f.write(&format!("/workspace/src/sub/{long_name}"), b"long")
        .unwrap();
    symlink("a.txt", f.host("/workspace/src/rel-link")).unwrap();
    symlink(&outside, f.host("/workspace/src/host-dir")).unwrap();
    let long_target = format!("./{}/../a.txt", "t".repeat(120));
    symlink(&long_target, f.host("/workspace/src/long-link")).unwrap();
    fs::set_permissions(
        f.host("/workspace/src/a.txt"),
        fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.host("/workspace/src/fifo"),
        FileType::Fifo,
        Mode::from_bits_truncate(0o600),
        0,
    )
    .unwrap();

    let mut archive = Vec::new();
    f.sandbox
        .write_tar("/workspace/src/", &mut archive)
        .unwrap();
    // A directory comes before what it holds; siblings in the directory's order.
    let names = tar_names(&archive);
    let at = |name: &str| names.iter().position(|n| n == name).unwrap();
    assert!(at("sub/") < at("sub/b.bin"), "{names:?}");
    let mut names = names;
    names.sort();
    assert_eq!(
        names,
        [
            "a.txt",
            "empty/",
            "host-dir",
            "long-link",
            "rel-link",
            "sub/",
            "sub/b.bin",
            &format!("sub/{long_name}"),
        ]
    );
    for entry in tar::Archive::new(&archive[..]).entries().unwrap() {
        let entry = entry.unwrap();
        let path = entry.path_bytes().into_owned();
        let link = entry.link_name_bytes().map(|l| l.into_owned());
        match &path[..] {
            b"host-dir" => assert_eq!(link.unwrap(), outside.as_bytes()),
            b"long-link" => assert_eq!(link.unwrap(), long_target.as_bytes()),
            b"a.txt" => assert_eq!(entry.header().mode().unwrap(), 0o4755),
            _ => {}
        }
        assert_eq!(entry.header().uid().unwrap(), 0);
    }
    assert!(!archive.windows(CANARY.len()).any(|w| w == CANARY));

    let summary = f
        .sandbox
        .extract_tar("/workspace/copy", &archive[..], limits())
        .unwrap();
    assert_eq!(summary.entries, 8);
    assert_eq!(summary.skipped, 0);
    assert_eq!(summary.bytes, 5 + 4 + 4);
    assert_eq!(f.read("/workspace/copy/a.txt").unwrap(), b"alpha");
    assert_eq!(
        f.read(&format!("/workspace/copy/sub/{long_name}")).unwrap(),
        b"long"
    );
    assert_eq!(
        fs::read_link(f.host("/workspace/copy/host-dir")).unwrap(),
        Path::new(&outside)
    );
    assert_eq!(
        fs::read_link(f.host("/workspace/copy/long-link")).unwrap(),
        Path::new(&long_target)
    );
    let (uid, gid) = owner();
    for path in ["a.txt", "empty", "sub", "sub/b.bin", "rel-link", "host-dir"] {
        let meta = fs::symlink_metadata(f.host(&format!("/workspace/copy/{path}"))).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (uid, gid), "{path}");
    }
    // Set-id bits are dropped.
    let mode = fs::metadata(f.host("/workspace/copy/a.txt"))
        .unwrap()
        .mode();
    assert_eq!(mode & 0o7777, 0o755);
    let mtime = fs::metadata(f.host("/workspace/copy/sub/b.bin"))
        .unwrap()
        .mtime();
    assert_eq!(
        mtime,
        fs::metadata(f.host("/workspace/src/sub/b.bin"))
            .unwrap()
            .mtime()
    );
    f.assert_canary_intact();
}

#[test]
fn extraction_refuses_names_that_climb_or_are_absolute() {
    let f = fixture();
    let canary = canary_host_path(&f);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            raw_tar(&[raw("../x", EntryType::Regular).data(b"x")], true),
            "../x",
        ),
        (
            raw_tar(&[raw("a/../../x", EntryType::Regular).data(b"x")], true),
            "a/../../x",
        ),
        (
            raw_tar(&[raw("/abs", EntryType::Regular).data(b"x")], true),
            "/abs",
        ),
        (raw_tar(&[raw("..", EntryType::Directory)], true), ".."),
        (
            raw_tar(
                &[Raw {
                    name: b"dummy",
                    kind: EntryType::Link,
                    data: b"",
                    link: format!("../../../../..{canary}").leak().as_bytes(),
                    size: None,
                }],
                true,
            ),
            "hard link ..",
        ),
        (
            raw_tar(
                &[Raw {
                    name: b"dummy",
                    kind: EntryType::Link,
                    data: b"",
                    link: canary.clone().leak().as_bytes(),
                    size: None,
                }],
                true,
            ),
            "hard link absolute",
        ),
    ];
    for (archive, what) in cases {
        assert_err!(
            f.sandbox
                .extract_tar("/workspace/x", &archive[..], limits()),
            Escapes
        );
        // The directory the request made is gone with the rest.
        assert!(!f.host("/workspace/x").exists(), "{what}");
    }
    assert!(!f.host("/workspace/abs").exists());
    assert!(!f.host("/x").exists());
    f.assert_canary_intact();
}

/// Names in a host directory left behind by an extraction's stage.
fn stages_in(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".brig-tmp-"))
        .collect()
}

#[test]
fn a_refused_archive_changes_nothing() {
    let f = fixture();
    f.sandbox.mkdir_all("/workspace/t/d").unwrap();
    fs::set_permissions(f.host("/workspace/t/d"), fs::Permissions::from_mode(0o700)).unwrap();
    f.write("/workspace/t/keep", b"old").unwrap();
    f.write("/workspace/t/was-a-file", b"file").unwrap();
    let entries = |bad: bool| {
        let mut entries = vec![
            raw("keep", EntryType::Regular).data(b"new"),
            raw("d", EntryType::Directory),
            raw("d/new", EntryType::Regular).data(b"n"),
            raw("fresh/deep/file", EntryType::Regular).data(b"f"),
            raw("fresh/link", EntryType::Symlink).link("deep/file"),
            raw("was-a-file", EntryType::Directory),
            raw("was-a-file/inside", EntryType::Regular).data(b"i"),
        ];
        if bad {
            // Refused after everything above was read and written.
            entries.push(raw("../escape", EntryType::Regular).data(b"x"));
        }
        raw_tar(&entries, true)
    };

    assert_err!(
        f.sandbox
            .extract_tar("/workspace/t", &entries(true)[..], limits()),
        Escapes
    );
    assert_eq!(f.names("/workspace/t"), ["d", "keep", "was-a-file"]);
    assert_eq!(fs::read(f.host("/workspace/t/keep")).unwrap(), b"old");
    assert_eq!(f.names("/workspace/t/d"), Vec::<String>::new());
    assert_eq!(
        fs::read(f.host("/workspace/t/was-a-file")).unwrap(),
        b"file"
    );
    assert!(!f.host("/workspace/escape").exists());

    // The same archive without its bad entry lands whole, merged into what is
    // there: an existing directory keeps its mode, a file gives way to a
    // directory, and no stage is left.
    f.sandbox
        .extract_tar("/workspace/t", &entries(false)[..], limits())
        .unwrap();
    assert_eq!(fs::read(f.host("/workspace/t/keep")).unwrap(), b"new");
    assert_eq!(fs::read(f.host("/workspace/t/d/new")).unwrap(), b"n");
    let mode = fs::metadata(f.host("/workspace/t/d")).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o700);
    assert_eq!(
        fs::read(f.host("/workspace/t/fresh/link")).unwrap(),
        b"f",
        "the symlink resolves inside the tree"
    );
    assert_eq!(
        fs::read(f.host("/workspace/t/was-a-file/inside")).unwrap(),
        b"i"
    );
    assert!(stages_in(&f.host("/workspace/t")).is_empty());
}

#[test]
fn an_archive_entry_never_replaces_a_directory_of_the_tree() {
    let f = fixture();
    f.sandbox.mkdir_all("/workspace/u/dir/sub").unwrap();
    let archive = raw_tar(
        &[
            raw("first", EntryType::Regular).data(b"1"),
            raw("dir", EntryType::Regular).data(b"over a directory"),
        ],
        true,
    );
    assert_err!(
        f.sandbox
            .extract_tar("/workspace/u", &archive[..], limits()),
        NotAFile
    );
    assert_eq!(f.names("/workspace/u"), ["dir"]);
    assert_eq!(f.names("/workspace/u/dir"), ["sub"]);
}

#[test]
fn extraction_never_follows_symlinks() {
    let f = fixture();
    let outside = f.outside.to_str().unwrap().to_string();
    // `evil -> /` then `evil/etc/passwd`.
    let archive = raw_tar(
        &[
            raw("evil", EntryType::Symlink).link("/"),
            raw("evil/etc/passwd", EntryType::Regular).data(b"root::0:0::/:/bin/sh\n"),
        ],
        true,
    );
    let message = assert_err!(
        f.sandbox
            .extract_tar("/workspace/x", &archive[..], limits()),
        Escapes
    );
    assert!(message.contains("symlink"), "{message}");
    // All or nothing: not even the symlink stays.
    assert!(!f.host("/workspace/x").exists());
    assert!(!f.host("/etc").exists());

    // A symlink to the host directory, then a file through it.
    let link = outside.clone();
    let archive = raw_tar(
        &[
            raw("out", EntryType::Symlink).link(link.leak()),
            raw("out/canary", EntryType::Regular).data(b"pwned"),
        ],
        true,
    );
    assert_err!(
        f.sandbox
            .extract_tar("/workspace/y", &archive[..], limits()),
        Escapes
    );

    // A symlink the sandbox made before, in the way of an entry.
    f.sandbox.mkdir_all("/workspace/z").unwrap();
    symlink(&outside, f.host("/workspace/z/pre")).unwrap();
    let archive = raw_tar(
        &[raw("pre/canary", EntryType::Regular).data(b"pwned")],
        true,
    );
    assert_err!(
        f.sandbox
            .extract_tar("/workspace/z", &archive[..], limits()),
        Escapes
    );

    // A symlink at the name of a file entry is replaced, not written through.
    symlink(canary_host_path(&f), f.host("/workspace/z/target")).unwrap();
    let archive = raw_tar(
        &[
            raw("target", EntryType::Regular).data(b"new"),
            raw("later", EntryType::Symlink).link(canary_host_path(&f).leak()),
            raw("later", EntryType::Regular).data(b"replaced"),
        ],
        true,
    );
    f.sandbox
        .extract_tar("/workspace/z", &archive[..], limits())
        .unwrap();
    assert_eq!(fs::read(f.host("/workspace/z/target")).unwrap(), b"new");
    assert_eq!(fs::read(f.host("/workspace/z/later")).unwrap(), b"replaced");
    assert!(fs::symlink_metadata(f.host("/workspace/z/target"))
        .unwrap()
        .is_file());
    f.assert_canary_intact();
}

#[test]
fn extraction_hard_links_only_to_earlier_entries() {
    let f = fixture();
    let archive = raw_tar(
        &[
            raw("dir/file", EntryType::Regular).data(b"shared"),
            raw("dir/link", EntryType::Link).link("dir/file"),
            raw("again", EntryType::Link).link("./dir//file"),
        ],
        true,
    );
    f.sandbox
        .extract_tar("/workspace/h", &archive[..], limits())
        .unwrap();
    let ino = |p: &str| fs::metadata(f.host(p)).unwrap().ino();
    assert_eq!(ino("/workspace/h/dir/file"), ino("/workspace/h/dir/link"));
    assert_eq!(ino("/workspace/h/dir/file"), ino("/workspace/h/again"));

    // A file that exists in the sandbox but was not in the archive.
    f.write("/workspace/h2/existing", b"sandbox file").unwrap();
    let archive = raw_tar(&[raw("link", EntryType::Link).link("existing")], true);
    assert_err!(
        f.sandbox
            .extract_tar("/workspace/h2", &archive[..], limits()),
        InvalidArchive
    );
    assert_eq!(f.names("/workspace/h2"), ["existing"]);
    f.assert_canary_intact();
}

#[test]
fn extraction_limits() {
    let f = fixture();
    // A declared size over the limit: refused before anything is written.
    let huge = raw_tar(
        &[Raw {
            name: b"huge",
            kind: EntryType::Regular,
            data: b"",
            link: b"",
            size: Some(10 << 30),
        }],
        false,
    );
    assert_err!(
        f.sandbox.extract_tar("/workspace/l", &huge[..], limits()),
        TooLarge
    );
    assert!(!f.host("/workspace/l").exists());

    // The byte limit counts over all entries.
    let two = raw_tar(
        &[
            raw("a", EntryType::Regular).data(&[1; 600]),
            raw("b", EntryType::Regular).data(&[2; 600]),
        ],
        true,
    );
    let small = ExtractLimits {
        max_bytes: 1000,
        max_entries: 10,
    };
    f.sandbox.mkdir_all("/workspace/m").unwrap();
    assert_err!(
        f.sandbox.extract_tar("/workspace/m", &two[..], small),
        TooLarge
    );
    // A directory that was there stays, as it was.
    assert_eq!(f.names("/workspace/m"), Vec::<String>::new());

    let few = ExtractLimits {
        max_bytes: 1 << 20,
        max_entries: 1,
    };
    assert_err!(
        f.sandbox.extract_tar("/workspace/n", &two[..], few),
        TooLarge
    );

    // Cut in the middle of a file: the partial file is removed.
    let mut cut = raw_tar(
        &[raw("partial", EntryType::Regular).data(&[7; 5000])],
        false,
    );
    cut.truncate(512 + 3000);
    assert_err!(
        f.sandbox.extract_tar("/workspace/o", &cut[..], limits()),
        InvalidArchive
    );
    assert!(!f.host("/workspace/o").exists());

    // Cut between entries: reported, and the whole entries before it go too.
    let cut = raw_tar(&[raw("whole", EntryType::Regular).data(b"w")], false);
    assert_err!(
        f.sandbox.extract_tar("/workspace/p", &cut[..], limits()),
        InvalidArchive
    );
    assert!(!f.host("/workspace/p").exists());

    // Garbage.
    assert_err!(
        f.sandbox
            .extract_tar("/workspace/q", &[0x55u8; 2048][..], limits()),
        InvalidArchive
    );

    // A 2 MiB pax record, which the tar crate would hold in memory.
    let mut pax = Vec::new();
    let mut header = Header::new_ustar();
    header.set_path("PaxHeaders/x").unwrap();
    header.set_entry_type(EntryType::XHeader);
    let record_len = 2 << 20;
    header.set_size(record_len);
    header.set_cksum();
    pax.extend_from_slice(header.as_bytes());
    pax.resize(pax.len() + record_len as usize, b'a');
    pax.extend(raw_tar(&[raw("x", EntryType::Regular).data(b"x")], true));
    assert_err!(
        f.sandbox.extract_tar("/workspace/r", &pax[..], limits()),
        TooLarge
    );

    // Header room is counted from the end of the previous entry's data, however
    // large that was: a 2 MiB file does not buy the next entry a 2.5 MiB name
    // (nor does the name come back whole in the message).
    let data = vec![3u8; 2 << 20];
    let mut name = vec![1u8; (5 << 20) / 2];
    name.push(0);
    let long_named = raw_tar(
        &[
            raw("big", EntryType::Regular).data(&data),
            raw("././@LongLink", EntryType::GNULongName).data(&name),
            raw("x", EntryType::Regular).data(b"x"),
        ],
        true,
    );
    match f
        .sandbox
        .extract_tar("/workspace/t", &long_named[..], limits())
    {
        Err(RootfsError::TooLarge(message)) => assert!(message.len() < 4096, "{}", message.len()),
        other => panic!("{other:?}"),
    }

    // Devices and fifos are skipped.
    let special = raw_tar(
        &[
            raw("fifo", EntryType::Fifo),
            raw("null", EntryType::Char),
            raw("ok", EntryType::Regular).data(b"ok"),
        ],
        true,
    );
    let summary = f
        .sandbox
        .extract_tar("/workspace/s", &special[..], limits())
        .unwrap();
    assert_eq!(
        summary,
        ExtractSummary {
            entries: 3,
            bytes: 2,
            skipped: 2
        }
    );
    assert_eq!(f.names("/workspace/s"), ["ok"]);
    // No temporary file was left anywhere.
    let mut stack = vec![f.root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            assert!(!entry.file_name().to_string_lossy().starts_with(".brig-tmp"));
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            }
        }
    }
}

#[test]
fn extraction_keeps_directories_and_refuses_to_replace_them() {
    let f = fixture();
    f.write("/workspace/e/d/keep", b"k").unwrap();
    let archive = raw_tar(
        &[
            raw("./", EntryType::Directory),
            raw("d/", EntryType::Directory),
            raw("d/new", EntryType::Regular).data(b"n"),
        ],
        true,
    );
    f.sandbox
        .extract_tar("/workspace/e", &archive[..], limits())
        .unwrap();
    assert_eq!(f.names("/workspace/e/d"), ["keep", "new"]);
    let archive = raw_tar(&[raw("d", EntryType::Regular).data(b"x")], true);
    assert_err!(
        f.sandbox
            .extract_tar("/workspace/e", &archive[..], limits()),
        NotAFile
    );
    assert_eq!(f.names("/workspace/e/d"), ["keep", "new"]);
}

// ---- large files -------------------------------------------------------------

/// A deterministic byte stream of `len` bytes, generated as it is read.
struct Pattern {
    pos: u64,
    len: u64,
}

fn pattern_byte(i: u64) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

impl Read for Pattern {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min((self.len - self.pos) as usize);
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = pattern_byte(self.pos + i as u64);
        }
        self.pos += n as u64;
        Ok(n)
    }
}

/// Checks that what is written is the pattern, without keeping it.
struct PatternCheck {
    pos: u64,
}

impl Write for PatternCheck {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for (i, &b) in buf.iter().enumerate() {
            assert_eq!(b, pattern_byte(self.pos + i as u64), "at {}", self.pos);
        }
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A pipe between two threads with a small bounded buffer.
struct ChannelWriter(std::sync::mpsc::SyncSender<Vec<u8>>);
struct ChannelReader {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    pending: Vec<u8>,
    pos: usize,
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .send(buf.to_vec())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.pending.len() {
            match self.rx.recv() {
                Ok(chunk) => {
                    self.pending = chunk;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.pending.len() - self.pos);
        buf[..n].copy_from_slice(&self.pending[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[test]
fn large_files_stream() {
    const LEN: u64 = 64 << 20;
    let f = fixture();
    let mut writer = f.sandbox.create_write("/workspace/big/file", true).unwrap();
    assert_eq!(writer.copy_from(Pattern { pos: 0, len: LEN }).unwrap(), LEN);
    assert_eq!(writer.commit().unwrap(), LEN);
    let (file, stat) = f.sandbox.open_read("/workspace/big/file").unwrap();
    assert_eq!(stat.size_bytes, LEN);
    let mut check = PatternCheck { pos: 0 };
    std::io::copy(
        &mut std::io::BufReader::with_capacity(64 << 10, file),
        &mut check,
    )
    .unwrap();
    assert_eq!(check.pos, LEN);

    // Archive and extract it through a bounded pipe: neither side holds it.
    let (tx, rx) = std::sync::mpsc::sync_channel(4);
    let sandbox = SandboxRoot::open(&f.root, owner().0, owner().1).unwrap();
    let producer =
        std::thread::spawn(move || sandbox.write_tar("/workspace/big", ChannelWriter(tx)));
    let reader = ChannelReader {
        rx,
        pending: Vec::new(),
        pos: 0,
    };
    let summary = f
        .sandbox
        .extract_tar("/workspace/copy", reader, limits())
        .unwrap();
    producer.join().unwrap().unwrap();
    assert_eq!(summary.bytes, LEN);
    let (file, _) = f.sandbox.open_read("/workspace/copy/file").unwrap();
    let mut check = PatternCheck { pos: 0 };
    std::io::copy(&mut std::io::BufReader::new(file), &mut check).unwrap();
    assert_eq!(check.pos, LEN);
}

// ---- a real sandbox root: /proc/<pid>/root -----------------------------------

mod ns {
    use super::*;
    use std::io::BufRead;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// Runs in a new mount namespace: a tmpfs root with read-only binds of
    /// the host's system directories (to run `sleep`), a procfs at /proc and
    /// at /workspace/kproc, `$2` bound read-only at /ro and `$3` read-write
    /// at /mnt; then chroots into it.
    const SCRIPT: &str = r#"
set -e
R=$1
mount -t tmpfs -o mode=0755 brig-rootfs-test "$R"
mkdir "$R/usr" "$R/proc" "$R/workspace" "$R/ro" "$R/mnt" "$R/workspace/kproc"
for d in bin sbin lib lib64; do
  if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$R/$d"
  elif [ -d "/$d" ]; then mkdir "$R/$d"; mount --bind "/$d" "$R/$d"; mount -o remount,bind,ro "$R/$d"
  fi
done
mount --bind /usr "$R/usr"; mount -o remount,bind,ro "$R/usr"
mount --bind "$2" "$R/ro"; mount -o remount,bind,ro "$R/ro"
mount --bind "$3" "$R/mnt"
mount -t proc proc "$R/proc"
mount -t proc proc "$R/workspace/kproc"
echo ready
exec chroot "$R" /usr/bin/sleep 600
"#;

    struct Sandbox {
        root: SandboxRoot,
        child: Reaper,
        tmp: tempfile::TempDir,
    }

    /// Kills and reaps the child however the test ends. It is the
    /// namespace's only process: its mounts go with it.
    struct Reaper(Child);

    impl Drop for Reaper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn spawn() -> Option<Sandbox> {
        if !is_root() {
            eprintln!("skipped: needs root for mount namespaces");
            return None;
        }
        // Without CAP_SYS_ADMIN (an unprivileged container), there is no
        // mount namespace to test in.
        let probe = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "true"])
            .stderr(Stdio::null())
            .status();
        if !probe.is_ok_and(|status| status.success()) {
            eprintln!("skipped: cannot create a mount namespace with unshare");
            return None;
        }
        let tmp = tempfile::Builder::new()
            .prefix("brig-rootfs-ns-")
            .tempdir()
            .unwrap();
        let root = tmp.path().join("root");
        let ro = tmp.path().join("ro");
        let mnt = tmp.path().join("mnt");
        for dir in [&root, &ro, &mnt] {
            fs::create_dir(dir).unwrap();
        }
        fs::write(ro.join("keep"), b"read-only bind").unwrap();
        fs::write(ro.join("secret"), b"host root only").unwrap();
        fs::set_permissions(ro.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(mnt.join("keep"), b"read-write bind").unwrap();
        let mut child = Reaper(
            Command::new("unshare")
                .args(["--mount", "--propagation", "private", "--"])
                .args(["sh", "-c", SCRIPT, "sh"])
                .args([&root, &ro, &mnt])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let mut line = String::new();
        let stdout = child.0.stdout.take().unwrap();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "ready",
            "the namespace setup failed (see stderr)"
        );
        // `ready` comes before the chroot: wait for the exec of sleep.
        let pid = child.0.id();
        let deadline = Instant::now() + Duration::from_secs(60);
        while fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default() != "sleep\n" {
            assert!(Instant::now() < deadline, "sleep did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        let (uid, gid) = owner();
        let root = SandboxRoot::open(Path::new(&format!("/proc/{pid}/root")), uid, gid).unwrap();
        Some(Sandbox { root, child, tmp })
    }

    #[test]
    fn real_sandbox_root() {
        let Some(s) = spawn() else { return };
        let sandbox = &s.root;
        let host_root = s.tmp.path().join("root");

        // Normal use, in the namespace's tmpfs (the host directory it is
        // mounted on stays empty).
        let mut w = sandbox.create_write("/workspace/hello", false).unwrap();
        w.write_chunk(b"hi").unwrap();
        w.commit().unwrap();
        let (mut file, _) = sandbox.open_read("/workspace/hello").unwrap();
        let mut data = String::new();
        file.read_to_string(&mut data).unwrap();
        assert_eq!(data, "hi");
        assert_eq!(fs::read_dir(&host_root).unwrap().count(), 0);
        let names: Vec<_> = sandbox
            .list_dir("/")
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert!(names.contains(&"workspace".to_string()), "{names:?}");
        let (mut sleep, _) = sandbox.open_read("/bin/sleep").unwrap();
        let mut elf = [0u8; 4];
        sleep.read_exact(&mut elf).unwrap();
        assert_eq!(&elf, b"\x7fELF");

        // Magic links are refused wherever they appear: /proc/self is this
        // process, /proc/self/root its (host) root.
        let pid = s.child.0.id();
        for path in [
            "/proc/self/root/etc/passwd".to_string(),
            "/proc/thread-self/root/etc/passwd".to_string(),
            format!("/proc/{pid}/root/bin/sleep"),
            "/proc/self/cwd/Cargo.toml".to_string(),
        ] {
            assert_err!(sandbox.open_read(&path), Escapes);
            assert_err!(sandbox.create_write(&path, true), Escapes);
            assert_err!(sandbox.remove(&path, true), Escapes);
            assert_err!(sandbox.mkdir_all(&path), Escapes);
            assert_err!(sandbox.list_dir(&path), Escapes);
        }
        assert_err!(sandbox.list_dir("/proc/self/root"), Escapes);
        assert_err!(
            sandbox.extract_tar("/proc/self/root/tmp", std::io::empty(), limits()),
            Escapes
        );
        // Also when a symlink of the sandbox leads there.
        symlink_in(sandbox, "/proc/self/root", "/workspace/p");
        assert_err!(sandbox.open_read("/workspace/p/etc/passwd"), Escapes);
        assert_err!(sandbox.list_dir("/workspace/p"), Escapes);
        assert_err!(sandbox.create_write("/workspace/p/tmp/x", false), Escapes);
        // And procfs itself is not served: environ, mem, fd links.
        for path in [
            "/proc/self/environ",
            "/proc/1/mem",
            "/proc/self/fd/0",
            "/proc/self/status",
        ] {
            assert_err!(sandbox.open_read(path), Escapes);
        }
        assert_err!(sandbox.list_dir("/proc"), Escapes);
        assert_err!(sandbox.list_dir("/proc/self/fd"), Escapes);
        assert_err!(sandbox.remove("/proc/self/environ", false), Escapes);
        assert_err!(sandbox.create_write("/proc/self/x", false), Escapes);

        // An archive of /workspace leaves the procfs mounted in it out.
        let mut archive = Vec::new();
        sandbox.write_tar("/workspace", &mut archive).unwrap();
        let mut names = tar_names(&archive);
        names.sort();
        assert_eq!(names, ["hello", "p"]);

        // Mounts are neither removed nor entered by a removal.
        assert_err!(sandbox.remove("/mnt", true), Busy);
        assert_err!(sandbox.remove("/workspace/kproc", true), Busy);
        assert_err!(sandbox.create_write("/mnt", false), Busy);
        assert_eq!(
            fs::read(s.tmp.path().join("mnt/keep")).unwrap(),
            b"read-write bind"
        );
        assert_err!(sandbox.rename("/mnt", "/workspace/m"), Busy);
        assert_err!(sandbox.rename("/workspace/hello", "/workspace/kproc"), Busy);
        assert_err!(sandbox.rename("/workspace/p", "/mnt/p"), InvalidPath);
        // Read-only mounts are typed.
        assert_err!(sandbox.remove("/ro/keep", false), ReadOnly);
        assert_err!(sandbox.create_write("/ro/new", false), ReadOnly);
        assert_err!(sandbox.mkdir_all("/usr/brig-rootfs-test"), ReadOnly);
        assert_eq!(
            fs::read(s.tmp.path().join("ro/keep")).unwrap(),
            b"read-only bind"
        );
        // A host file bound in, which the sandbox's user could not read.
        assert_eq!(read_all(sandbox, "/ro/keep"), b"read-only bind");
        assert_err!(sandbox.open_read("/ro/secret"), PermissionDenied);

        // Last, as it removes what comes before the mount in the walk.
        assert_err!(sandbox.remove("/workspace", true), Busy);
        assert!(sandbox.list_dir("/workspace/kproc").is_err());
    }

    #[test]
    fn an_archive_reaching_into_other_mounts_is_all_or_nothing() {
        let Some(s) = spawn() else { return };
        let sandbox = &s.root;
        let bound = s.tmp.path().join("mnt");
        let entries = |last: Raw<'static>| {
            raw_tar(
                &[
                    raw("workspace/top", EntryType::Regular).data(b"t"),
                    raw("mnt/inner/file", EntryType::Regular).data(b"m"),
                    raw("mnt/keep", EntryType::Regular).data(b"replaced"),
                    last,
                ],
                true,
            )
        };
        // Refused at its last entry: nothing in the tmpfs root, nothing in
        // the read-write bind, and no stage left in either.
        let refused = entries(raw("ro/new", EntryType::Regular).data(b"r"));
        assert_err!(sandbox.extract_tar("/", &refused[..], limits()), ReadOnly);
        assert!(sandbox.open_read("/workspace/top").is_err());
        assert!(!bound.join("inner").exists());
        assert_eq!(fs::read(bound.join("keep")).unwrap(), b"read-write bind");
        assert!(stages_in(&bound).is_empty());
        assert_eq!(list(sandbox, "/"), list_expected());

        // Accepted: each mount's entries land in it.
        let accepted = entries(raw("workspace/last", EntryType::Regular).data(b"l"));
        sandbox.extract_tar("/", &accepted[..], limits()).unwrap();
        assert_eq!(read_all(sandbox, "/workspace/top"), b"t");
        assert_eq!(fs::read(bound.join("inner/file")).unwrap(), b"m");
        assert_eq!(fs::read(bound.join("keep")).unwrap(), b"replaced");
        assert!(stages_in(&bound).is_empty());
        assert_eq!(list(sandbox, "/"), list_expected());
    }

    fn list(sandbox: &SandboxRoot, path: &str) -> Vec<String> {
        let mut names: Vec<_> = sandbox
            .list_dir(path)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        names.sort();
        names
    }

    /// What the namespace's root holds (see `SCRIPT`), with nothing staged.
    fn list_expected() -> Vec<String> {
        let mut names: Vec<String> = ["usr", "proc", "workspace", "ro", "mnt"]
            .into_iter()
            .map(String::from)
            .collect();
        for d in ["bin", "sbin", "lib", "lib64"] {
            if Path::new("/").join(d).exists() {
                names.push(d.to_string());
            }
        }
        names.sort();
        names
    }

    fn read_all(sandbox: &SandboxRoot, path: &str) -> Vec<u8> {
        let (mut file, _) = sandbox.open_read(path).unwrap();
        let mut data = Vec::new();
        file.read_to_end(&mut data).unwrap();
        data
    }

    /// Makes a symlink inside the sandbox, as its code would.
    fn symlink_in(sandbox: &SandboxRoot, target: &str, path: &str) {
        let archive = raw_tar(&[raw("p", EntryType::Symlink).link(target)], true);
        let dir = path.rsplit_once('/').unwrap().0;
        sandbox.extract_tar(dir, &archive[..], limits()).unwrap();
    }
}
