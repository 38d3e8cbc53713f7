//! A staged tree to one EROFS layer file, with mkfs.erofs from erofs-utils.
//!
//! No maintained Rust crate writes EROFS, and erofs-utils is the format's reference
//! implementation, so brig runs it (Debian package `erofs-utils`). Why EROFS and
//! not squashfs: bench/results/layer-format.md.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::error::{ImageError, Result};
use crate::progress::Progress;

pub const MKFS: &str = "mkfs.erofs";

/// The longest file name a layer holds. Linux allows 255 bytes, but erofs-utils
/// 1.5's mkfs.erofs fails on a name of 255 ("Could not format the device: [Error
/// 2]"), so trees are checked before packing ([`crate::tree::digest_excluding`]):
/// the error then names the path instead of the tool's failure.
pub const MAX_NAME_BYTES: usize = 254;

#[derive(Debug, Clone, Default)]
pub struct PackOptions {
    /// Store every file as owned by this uid:gid (a snapshot of a sandbox whose one
    /// mapped id stood for the image's root).
    pub force_owner: Option<(u32, u32)>,
    /// Paths relative to the tree left out, with everything below them (the
    /// digest leaves out the same).
    pub exclude: Vec<std::path::PathBuf>,
    /// `cgroup.procs` files the packer joins as soon as it starts: the cgroup of
    /// the sandbox a snapshot is of, so that its tenant pays for the packing's CPU
    /// and memory. Its OOM score is made the highest, so that a memory limit too
    /// small to pack kills the packer rather than the sandbox's own processes.
    pub charge_to: Vec<std::path::PathBuf>,
}

/// Moves the packer `pid` into the cgroups whose `cgroup.procs` files are `procs`,
/// first making it what their OOM killer picks.
fn charge(pid: u32, procs: &[std::path::PathBuf]) -> Result<()> {
    if procs.is_empty() {
        return Ok(());
    }
    let adj = format!("/proc/{pid}/oom_score_adj");
    std::fs::write(&adj, "1000").map_err(|e| ImageError::io(format!("write {adj}"), e))?;
    for file in procs {
        std::fs::write(file, pid.to_string())
            .map_err(|e| ImageError::io(format!("join {}", file.display()), e))?;
    }
    Ok(())
}

/// Waits for a tool brig started, killing it when `progress` is cancelled (Ctrl-C).
pub fn wait_cancellable(
    child: &mut std::process::Child,
    tool: &str,
    progress: &dyn Progress,
) -> Result<std::process::ExitStatus> {
    loop {
        if progress.cancelled() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ImageError::Interrupted);
        }
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(ImageError::io(format!("wait for {tool}"), e)),
        }
    }
}

/// Packs `source` into the new file `dest`. lz4 rather than lz4hc: erofs-utils
/// 1.5's lz4hc packs large incompressible files at ~2 MiB/s, which made snapshots
/// take tens of seconds for layers a few percent smaller (bench/results/images.md).
/// Mtimes are kept exactly (Python checks .pyc files against them); ownership, modes, xattrs (overlay's opaque marker
/// included) and whiteout devices are kept as they are.
pub fn pack(
    source: &Path,
    dest: &Path,
    options: &PackOptions,
    progress: &dyn Progress,
) -> Result<()> {
    let mut command = Command::new(MKFS);
    command.arg("-zlz4").arg("--preserve-mtime").arg("--quiet");
    for path in &options.exclude {
        // Relative to the source directory, as erofs-utils matches it.
        command.arg(format!("--exclude-path={}", path.display()));
    }
    if let Some((uid, gid)) = options.force_owner {
        command
            .arg(format!("--force-uid={uid}"))
            .arg(format!("--force-gid={gid}"));
    }
    command
        .arg(dest)
        .arg(source)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    brig_sys::process::die_with_parent(&mut command);
    let mut child = command.spawn().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ImageError::Tool {
                tool: MKFS.into(),
                detail: "not found: install erofs-utils (apt-get install erofs-utils)".into(),
            }
        } else {
            ImageError::io(format!("start {MKFS}"), e)
        }
    })?;
    if let Err(e) = charge(child.id(), &options.charge_to) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    let status = wait_cancellable(&mut child, MKFS, progress)?;
    if status.success() {
        return Ok(());
    }
    if !options.charge_to.is_empty()
        && std::os::unix::process::ExitStatusExt::signal(&status)
            == Some(rustix::process::Signal::KILL.as_raw())
    {
        return Err(ImageError::OutOfMemory(
            "packing the snapshot was killed: the session's memory limit, which pays for \
             packing, could not hold it; free some of the session's memory (its files in \
             /tmp and /workspace count) or give it more"
                .into(),
        ));
    }
    if progress.cancelled() {
        return Err(ImageError::Interrupted);
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        use std::io::Read;
        let _ = pipe.read_to_string(&mut stderr);
    }
    // erofs-utils reports errors as "<E> ..." lines, sometimes followed by its usage
    // text: keep the errors, else the last line.
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.trim_start().starts_with("<E>"))
        .collect();
    let detail = if errors.is_empty() {
        stderr
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .unwrap_or("no message")
            .to_string()
    } else {
        errors.join("; ")
    };
    Err(ImageError::Tool {
        tool: MKFS.into(),
        detail: format!("{status}: {detail}"),
    })
}
