//! The merged view of a stack of layers, and diffs between two stacks.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::ops::Bound;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{is_overlay_xattr, scan, Entry, Kind, Metadata, OPAQUE_XATTR};
use crate::{IoContext, Result};

/// What an overlayfs mount of `layers` (bottom first) shows: every path, from
/// `/` down, with the entry of the uppermost layer that provides it.
///
/// Whiteouts are not in the view; see the module docs for the rules.
pub fn merged(layers: &[&Path]) -> Result<BTreeMap<PathBuf, Entry>> {
    let mut view = BTreeMap::new();
    for (index, &layer) in layers.iter().enumerate() {
        // Parents come before their children, so hiding what a directory covers
        // happens before the same layer adds its own children.
        scan::walk(layer, |rel, full, st| {
            let path = Path::new("/").join(rel);
            let mut meta = Metadata::read(full, st)?;
            if meta.is_whiteout() {
                remove_below(&mut view, &path);
                view.remove(&path);
                return Ok(false);
            }
            // Like the kernel, which builds the root from all layers' roots
            // without looking them up, ignore a layer root's opaque xattr.
            let opaque = meta.kind == Kind::Dir
                && !rel.as_os_str().is_empty()
                && meta.xattrs.get(OsStr::new(OPAQUE_XATTR)).map(Vec::as_slice) == Some(b"y");
            // The mount hides overlayfs' own xattrs.
            meta.xattrs.retain(|name, _| !is_overlay_xattr(name));
            let merges = meta.kind == Kind::Dir
                && !opaque
                && view
                    .get(&path)
                    .is_some_and(|lower: &Entry| lower.meta.kind == Kind::Dir);
            if !merges {
                remove_below(&mut view, &path);
            }
            view.insert(
                path,
                Entry {
                    meta,
                    layer: index,
                    source: full.to_path_buf(),
                },
            );
            Ok(true)
        })?;
    }
    Ok(view)
}

/// Removes every path strictly below `dir`.
fn remove_below(view: &mut BTreeMap<PathBuf, Entry>, dir: &Path) {
    // Paths order component by component, so a subtree is one contiguous range
    // right after its root.
    let below: Vec<PathBuf> = view
        .range::<Path, _>((Bound::Excluded(dir), Bound::Unbounded))
        .map(|(path, _)| path)
        .take_while(|path| path.starts_with(dir))
        .cloned()
        .collect();
    for path in below {
        view.remove(&path);
    }
}

/// The differences between two merged views. Paths are absolute-style
/// (`/etc/passwd`) and each list is sorted in path order, a directory right
/// before what is below it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Diff {
    /// Only in the second stack, including everything below an added directory.
    pub added: Vec<PathBuf>,
    /// In both, with a different kind, metadata, xattrs or content.
    pub changed: Vec<PathBuf>,
    /// Only in the first stack, including everything below a deleted directory.
    pub deleted: Vec<PathBuf>,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.deleted.is_empty()
    }
}

/// What changes from the merged view of stack `a` to that of stack `b` (both
/// bottom first). A rename is a deletion of the old path and an addition of the
/// new one.
pub fn diff(a: &[&Path], b: &[&Path]) -> Result<Diff> {
    let old = merged(a)?;
    let new = merged(b)?;
    let mut diff = Diff::default();
    for (path, before) in &old {
        match new.get(path) {
            None => diff.deleted.push(path.clone()),
            Some(after) => {
                if !same(before, after)? {
                    diff.changed.push(path.clone());
                }
            }
        }
    }
    diff.added = new
        .keys()
        .filter(|path| !old.contains_key(*path))
        .cloned()
        .collect();
    Ok(diff)
}

/// Whether two entries of the same path are indistinguishable in a mount.
fn same(a: &Entry, b: &Entry) -> Result<bool> {
    if a.meta != b.meta {
        return Ok(false);
    }
    // Contents are read only when nothing cheaper tells the files apart; two
    // stacks sharing a layer share its files.
    if a.meta.kind != Kind::File || a.source == b.source {
        return Ok(true);
    }
    same_contents(a, b)
}

fn same_contents(a: &Entry, b: &Entry) -> Result<bool> {
    let mut fa = open(a)?;
    let mut fb = open(b)?;
    let mut ba = vec![0; 1 << 16];
    let mut bb = vec![0; 1 << 16];
    loop {
        let na = fill(&mut fa, &mut ba).context(|| format!("reading {}", a.source.display()))?;
        let nb = fill(&mut fb, &mut bb).context(|| format!("reading {}", b.source.display()))?;
        if ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na < ba.len() {
            return Ok(true);
        }
    }
}

fn open(entry: &Entry) -> Result<File> {
    scan::open_file(&entry.source, &scan::lstat(&entry.source)?)
}

/// Reads until `buf` is full or the file ends, so that chunks of two files line
/// up however the reads are split.
fn fill(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            m => n += m,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry {
            meta: Metadata {
                kind: Kind::Dir,
                mode: 0o755,
                uid: 0,
                gid: 0,
                size: 0,
                mtime: 0,
                mtime_nsec: 0,
                target: None,
                device: None,
                xattrs: BTreeMap::new(),
            },
            layer: 0,
            source: PathBuf::new(),
        }
    }

    #[test]
    fn remove_below_takes_the_subtree_only() {
        let mut view: BTreeMap<PathBuf, Entry> = [
            "/", "/a", "/a/b", "/a/b/c", "/a b", "/a-", "/a.d", "/ab", "/b",
        ]
        .into_iter()
        .map(|p| (PathBuf::from(p), entry()))
        .collect();
        remove_below(&mut view, Path::new("/a"));
        let left: Vec<_> = view.keys().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(left, ["/", "/a", "/a b", "/a-", "/a.d", "/ab", "/b"]);
        remove_below(&mut view, Path::new("/"));
        assert_eq!(view.keys().collect::<Vec<_>>(), [Path::new("/")]);
    }
}
