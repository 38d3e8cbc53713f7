//! Entries of a session's files described one by one: stat, a listing to a depth,
//! moving, making a directory that may exist. What front ends that mirror another
//! system's filesystem calls (E2B's envd) need beyond reading and writing.

use super::files::{audited, change_root, rootfs_error, with_root};
use super::lookup;
use crate::auth::Caller;
use crate::fault::Error as ApiError;
use crate::rootfs::{EntryKind, EntryStat, RootfsError, MAX_LIST_ENTRIES};
use crate::state::AppState;

/// An entry found by [`walk`]: its path (under the path asked, as asked) and what
/// it is.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: String,
    pub stat: EntryStat,
}

fn child(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// Describes `path` in session `id` (a symlink itself, see
/// [`crate::rootfs::SandboxRoot::stat`]); audited as `file.stat`.
pub async fn stat(
    state: &AppState,
    caller: &Caller,
    id: &str,
    path: &str,
) -> Result<EntryStat, ApiError> {
    let operation = {
        let (state, caller, id, path) = (
            state.clone(),
            caller.clone(),
            id.to_string(),
            path.to_string(),
        );
        async move {
            let session = lookup(&state, &caller, &id)?;
            with_root(&session, move |root| root.stat(&path).map_err(rootfs_error)).await
        }
    };
    audited(state, caller, id, "file.stat", path, operation).await
}

/// The entries below directory `path` (followed if a symlink) down to `depth`
/// levels (1: its own entries), depth first, each directory's entries by name;
/// symlinks to directories are not descended into. Entries removed meanwhile are
/// left out. At most [`MAX_LIST_ENTRIES`] in all, else `TooLarge`. Audited as
/// `file.list`.
pub async fn walk(
    state: &AppState,
    caller: &Caller,
    id: &str,
    path: &str,
    depth: u32,
) -> Result<Vec<Entry>, ApiError> {
    let operation = {
        let (state, caller, id, path) = (
            state.clone(),
            caller.clone(),
            id.to_string(),
            path.to_string(),
        );
        async move {
            let session = lookup(&state, &caller, &id)?;
            with_root(&session, move |root| {
                let mut out = Vec::new();
                walk_in(&root, &path, depth.max(1), &mut out).map_err(rootfs_error)?;
                Ok(out)
            })
            .await
        }
    };
    audited(state, caller, id, "file.list", path, operation).await
}

fn walk_in(
    root: &crate::rootfs::SandboxRoot,
    dir: &str,
    depth: u32,
    out: &mut Vec<Entry>,
) -> Result<(), RootfsError> {
    for entry in root.list_dir(dir)? {
        let path = child(dir, &entry.name);
        let stat = match root.stat(&path) {
            Ok(stat) => stat,
            Err(RootfsError::NotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        if out.len() >= MAX_LIST_ENTRIES {
            return Err(RootfsError::TooLarge(format!(
                "{dir}: more than {MAX_LIST_ENTRIES} entries"
            )));
        }
        let descend = depth > 1 && stat.kind == EntryKind::Directory;
        out.push(Entry {
            path: path.clone(),
            stat,
        });
        if descend {
            match walk_in(root, &path, depth - 1, out) {
                // A directory the user may not list is shown, not entered.
                Ok(()) | Err(RootfsError::PermissionDenied(_) | RootfsError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Moves `from` to `to` in session `id` (rename(2) inside the sandbox), making
/// `to`'s missing parent directories first; audited as `file.move`.
pub async fn rename(
    state: &AppState,
    caller: &Caller,
    id: &str,
    from: &str,
    to: &str,
) -> Result<(), ApiError> {
    let operation = {
        let (state, caller, id, from, to) = (
            state.clone(),
            caller.clone(),
            id.to_string(),
            from.to_string(),
            to.to_string(),
        );
        async move {
            change_root(&state, &caller, &id, move |root| {
                // Checked first, so that a missing source makes no directories.
                root.stat(&from).map_err(rootfs_error)?;
                let parent = match to.trim_end_matches('/').rfind('/') {
                    Some(0) | None => "/".to_string(),
                    Some(slash) => to[..slash].to_string(),
                };
                root.mkdir_all(&parent).map_err(rootfs_error)?;
                root.rename(&from, &to).map_err(rootfs_error)
            })
            .await
        }
    };
    let detail = format!("{from} -> {to}");
    audited(state, caller, id, "file.move", &detail, operation).await
}

/// Makes directory `path` in session `id` and its parents; `false` if it was
/// already a directory (nothing changed), `AlreadyExists` if something else is
/// there. Audited as `file.mkdir`.
pub async fn make_dir(
    state: &AppState,
    caller: &Caller,
    id: &str,
    path: &str,
) -> Result<bool, ApiError> {
    let operation = {
        let (state, caller, id, path) = (
            state.clone(),
            caller.clone(),
            id.to_string(),
            path.to_string(),
        );
        async move {
            change_root(&state, &caller, &id, move |root| {
                let real = match root.real_path(&path) {
                    Ok(real) => Some(real),
                    Err(RootfsError::NotFound(_)) => None,
                    Err(e) => return Err(rootfs_error(e)),
                };
                if let Some(real) = real {
                    let stat = root.stat(&real).map_err(rootfs_error)?;
                    if stat.kind == EntryKind::Directory {
                        return Ok(false);
                    }
                    return Err(rootfs_error(RootfsError::AlreadyExists(format!(
                        "{path}: exists and is not a directory"
                    ))));
                }
                root.mkdir_all(&path).map_err(rootfs_error)?;
                Ok(true)
            })
            .await
        }
    };
    audited(state, caller, id, "file.mkdir", path, operation).await
}

/// What a directory held at one moment (names relative to it), to tell what
/// changed since by comparing two: a watch by polling, for sandboxes whose
/// inotify the daemon cannot read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    entries: std::collections::BTreeMap<String, Seen>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    kind: EntryKind,
    size: u64,
    modified_ns: i64,
    mode: u32,
}

/// How an entry changed between two snapshots (in inotify's terms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Create,
    Write,
    Remove,
    Chmod,
}

/// One change: the entry's name relative to the directory watched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub name: String,
    pub kind: ChangeKind,
}

/// A snapshot of directory `path` in session `id` (with everything below it if
/// `recursive`). Not audited: it is taken again and again while a watch lasts
/// (its start is the front end's to audit).
pub async fn snapshot(
    state: &AppState,
    caller: &Caller,
    id: &str,
    path: &str,
    recursive: bool,
) -> Result<Snapshot, ApiError> {
    let session = lookup(state, caller, id)?;
    let path = path.to_string();
    with_root(&session, move |root| {
        let mut found = Vec::new();
        let depth = if recursive { u32::MAX } else { 1 };
        walk_in(&root, &path, depth, &mut found).map_err(rootfs_error)?;
        let prefix = if path.ends_with('/') {
            path.clone()
        } else {
            format!("{path}/")
        };
        let entries = found
            .into_iter()
            .map(|e| {
                let name = e.path.strip_prefix(&prefix).unwrap_or(&e.path).to_string();
                let seen = Seen {
                    kind: e.stat.kind,
                    size: e.stat.size_bytes,
                    modified_ns: e
                        .stat
                        .modified
                        .saturating_mul(1_000_000_000)
                        .saturating_add(i64::from(e.stat.modified_nsec)),
                    mode: e.stat.mode,
                };
                (name, seen)
            })
            .collect();
        Ok(Snapshot { entries })
    })
    .await
}

/// What changed from `old` to `new`, by name: what appeared (a file that appeared
/// with content was also written), what was written (size or time changed), what
/// changed mode, what went. A rename shows as a removal and a creation.
pub fn changes(old: &Snapshot, new: &Snapshot) -> Vec<Change> {
    let mut out = Vec::new();
    let change = |name: &str, kind| Change {
        name: name.to_string(),
        kind,
    };
    for (name, now) in &new.entries {
        match old.entries.get(name) {
            None => {
                out.push(change(name, ChangeKind::Create));
                if now.kind == EntryKind::File && now.size > 0 {
                    out.push(change(name, ChangeKind::Write));
                }
            }
            Some(before) if before.kind != now.kind => {
                out.push(change(name, ChangeKind::Remove));
                out.push(change(name, ChangeKind::Create));
            }
            Some(before) => {
                let written = now.kind != EntryKind::Directory
                    && (before.size != now.size || before.modified_ns != now.modified_ns);
                if written {
                    out.push(change(name, ChangeKind::Write));
                }
                if before.mode != now.mode {
                    out.push(change(name, ChangeKind::Chmod));
                }
            }
        }
    }
    for name in old.entries.keys() {
        if !new.entries.contains_key(name) {
            out.push(change(name, ChangeKind::Remove));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rootfs::SandboxRoot;

    fn snap(entries: &[(&str, EntryKind, u64, i64, u32)]) -> Snapshot {
        Snapshot {
            entries: entries
                .iter()
                .map(|(n, kind, size, modified_ns, mode)| {
                    let seen = Seen {
                        kind: *kind,
                        size: *size,
                        modified_ns: *modified_ns,
                        mode: *mode,
                    };
                    (n.to_string(), seen)
                })
                .collect(),
        }
    }

    #[test]
    fn changes_between_snapshots_read_as_inotify_would() {
        use ChangeKind::*;
        use EntryKind::{Directory as D, File as F};
        let old = snap(&[
            ("a", F, 1, 1, 0o644),
            ("b", F, 1, 1, 0o644),
            ("d", D, 0, 1, 0o755),
        ]);
        let new = snap(&[
            ("a", F, 2, 2, 0o644),
            ("d", D, 0, 9, 0o700),
            ("d/n", F, 3, 5, 0o644),
            ("e", F, 0, 5, 0o644),
        ]);
        let got: Vec<(String, ChangeKind)> = changes(&old, &new)
            .into_iter()
            .map(|c| (c.name, c.kind))
            .collect();
        let want: Vec<(String, ChangeKind)> = [
            ("a", Write),
            ("d", Chmod),
            ("d/n", Create),
            ("d/n", Write),
            ("e", Create),
            ("b", Remove),
        ]
        .into_iter()
        .map(|(n, k)| (n.to_string(), k))
        .collect();
        assert_eq!(got, want);
        assert!(changes(&new, &new).is_empty());
    }

    #[test]
    fn walk_goes_depth_first_by_name_to_the_depth_asked() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["p/b/b2", "p/b/b1", "p/a/a1/deep"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        std::fs::write(dir.path().join("p/f"), b"x").unwrap();
        let (uid, gid) = (rustix::process::getuid(), rustix::process::getgid());
        let root = SandboxRoot::open(dir.path(), uid.as_raw(), gid.as_raw()).unwrap();
        let paths = |depth| {
            let mut out = Vec::new();
            walk_in(&root, "/p", depth, &mut out).unwrap();
            out.into_iter().map(|e| e.path).collect::<Vec<_>>()
        };
        assert_eq!(paths(1), ["/p/a", "/p/b", "/p/f"]);
        assert_eq!(
            paths(2),
            ["/p/a", "/p/a/a1", "/p/b", "/p/b/b1", "/p/b/b2", "/p/f"]
        );
        assert_eq!(paths(9).len(), 7);
    }
}
