//! File operations on a cgroup filesystem, and the small emulation a fake tree needs.
//!
//! Interface files are always opened without `O_CREAT`: they exist because the kernel
//! made them, and a missing one means the kernel lacks the feature. The whole value is
//! written with one `write(2)`, as cgroupfs requires.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// How directories behave. Everything else (reads, writes, existence checks) is the
/// same plain file I/O in both modes, so tests exercise the real code paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Backend {
    /// A real cgroupfs: the kernel populates new directories and lets `rmdir` remove
    /// a directory full of interface files.
    #[default]
    Real,
    /// A plain directory tree standing in for cgroupfs (tests). It emulates the two
    /// things a plain directory does differently: `mkdir` creates empty files named
    /// like the parent's regular files (as the kernel creates interface files), and
    /// `rmdir` first deletes the regular files inside (as cgroupfs ignores them).
    FakeTree,
}

impl Backend {
    pub(crate) fn mkdir(self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)?;
        if self == Backend::FakeTree {
            if let Some(parent) = path.parent() {
                for entry in fs::read_dir(parent)? {
                    let entry = entry?;
                    if entry.file_type()?.is_file() {
                        fs::File::create(path.join(entry.file_name()))?;
                    }
                }
            }
        }
        Ok(())
    }

    pub(crate) fn rmdir(self, path: &Path) -> io::Result<()> {
        if self == Backend::FakeTree {
            match fs::read_dir(path) {
                Ok(entries) => {
                    for entry in entries {
                        let entry = entry?;
                        if entry.file_type()?.is_file() {
                            fs::remove_file(entry.path())?;
                        }
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
        fs::remove_dir(path)
    }
}

/// Writes `value` to an existing interface file in one `write(2)`.
pub(crate) fn write(path: &Path, value: &str) -> io::Result<()> {
    // O_TRUNC is ignored by cgroupfs and keeps fake files exact.
    let mut file = OpenOptions::new().write(true).truncate(true).open(path)?;
    let written = file.write(value.as_bytes())?;
    if written != value.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short write ({written} of {} bytes)", value.len()),
        ));
    }
    Ok(())
}

pub(crate) fn read(path: &Path) -> io::Result<String> {
    fs::read_to_string(path)
}

/// The value of `key` in a flat-keyed file ("key value" per line), e.g. memory.events.
pub(crate) fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        if fields.next()? != key {
            return None;
        }
        fields.next()?.parse().ok()
    })
}

/// A file holding a single number, e.g. memory.peak.
pub(crate) fn single_value(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The pids listed in a cgroup.procs text.
pub(crate) fn pid_list(text: &str) -> Vec<i32> {
    text.split_whitespace()
        .filter_map(|field| field.parse().ok())
        .filter(|&pid: &i32| pid > 0)
        .collect()
}

/// One line saying what to do about a failed write, by errno.
pub(crate) fn hint(err: &io::Error) -> &'static str {
    match err.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => {
            "run brig as root or give it a cgroup parent delegated to its user"
        }
        Some(libc::ENOENT) => {
            "the kernel does not provide this file (controller missing, not enabled in the parent, or not compiled in)"
        }
        Some(libc::EBUSY) => {
            "the cgroup holds processes of its own (cgroup v2 'no internal processes' rule): use a parent cgroup without processes"
        }
        Some(libc::EINVAL) => {
            "the value is out of range for this kernel or above a limit of a parent cgroup"
        }
        Some(libc::EEXIST) => "pick another name or remove the leftover cgroup",
        _ => "check the cgroup setup of this host",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_values() {
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n";
        assert_eq!(keyed_value(text, "oom_kill"), Some(7));
        assert_eq!(keyed_value(text, "under_oom"), Some(0));
        assert_eq!(keyed_value(text, "oom"), None);
        // A key that is a prefix of another must not match it.
        assert_eq!(keyed_value("oom_kill_disable 1\n", "oom_kill"), None);
        assert_eq!(keyed_value("oom_kill x\n", "oom_kill"), None);
        assert_eq!(keyed_value("oom_kill\n", "oom_kill"), None);
        assert_eq!(keyed_value("", "oom_kill"), None);
    }

    #[test]
    fn single_values() {
        assert_eq!(single_value("123\n"), Some(123));
        assert_eq!(single_value("max\n"), None);
        assert_eq!(single_value(""), None);
        assert_eq!(single_value("-1"), None);
    }

    #[test]
    fn pid_lists() {
        assert_eq!(pid_list("12\n34\n"), vec![12, 34]);
        assert_eq!(pid_list(""), Vec::<i32>::new());
        // A pid from another pid namespace shows as 0; it must never be signalled.
        assert_eq!(pid_list("0\n5\n"), vec![5]);
    }

    #[test]
    fn fake_tree_emulation() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("memory.max"), "max\n").unwrap();
        let leaf = dir.path().join("leaf");
        Backend::FakeTree.mkdir(&leaf).unwrap();
        assert_eq!(fs::read_to_string(leaf.join("memory.max")).unwrap(), "");
        write(&leaf.join("memory.max"), "1048576").unwrap();
        assert_eq!(
            fs::read_to_string(leaf.join("memory.max")).unwrap(),
            "1048576"
        );
        // Never creates interface files.
        assert!(write(&leaf.join("pids.max"), "1").is_err());
        Backend::FakeTree.rmdir(&leaf).unwrap();
        assert!(!leaf.exists());
        assert!(dir.path().join("memory.max").exists());
    }
}
