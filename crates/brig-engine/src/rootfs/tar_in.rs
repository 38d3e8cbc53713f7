//! A tar stream extracted into a sandbox directory.
//!
//! Rules, for archives that may be hostile:
//! - names are relative: an absolute name or any `..` component is refused
//!   (`Escapes`), as is a hard link whose target is;
//! - every entry is resolved from the extraction directory's descriptor with
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`: no symlink is ever followed,
//!   whether an earlier entry made it or the sandbox had it there already
//!   (`evil -> /` then `evil/etc/passwd` is refused);
//! - files are written to a new temporary file and renamed into place, so a
//!   symlink or file already at the name is replaced, never written through;
//!   a directory or mount point there is refused;
//! - symlinks are created as they are (they are only ever resolved inside the
//!   sandbox), hard links only to entries extracted earlier from the same
//!   archive (checked by inode); fifos, devices and unknown types are
//!   skipped and counted;
//! - everything created belongs to the sandbox's user; modes come from the
//!   archive without set-id bits; existing directories keep theirs;
//! - limits: entries, and bytes declared by entry headers (checked before
//!   anything of an entry is written), plus 1 MiB of pax records and long
//!   names per entry, which the tar crate holds in memory.
//!
//! An extraction is all or nothing: entries are put together in a stage, a
//! directory of the daemon's own (root's, mode 0700: the sandbox cannot enter
//! it) inside the extraction directory, while each is checked against what is
//! already there. Only once the whole archive has been read and every entry
//! accepted is the stage moved into place, by renames within one filesystem
//! (entries bound below another mount, such as a volume, get a stage of their
//! own inside that mount). A refused archive, whatever entry is refused and
//! however far in, leaves the sandbox as it was, down to the extraction
//! directory if the request created it. The sandbox itself changing the same
//! names while the stage is moved in is the one case where part may land.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::{self, BufReader, Read};
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;
use tar::EntryType;

use super::error::{errno, show};
use super::fsops::{self, NodeId, Stopped, BENEATH, PATH_DIR, READ_DIR};
use super::path::{self, ArchivePathError};
use super::{
    check_replaceable, mount_point, with_temp_name, FillError, Filler, RootfsError, SandboxRoot,
    CHUNK, DIR_MODE, MAX_DEPTH, MODE_MASK,
};

/// What one extraction may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtractLimits {
    /// Sum of the sizes entry headers declare (file data, in practice).
    pub max_bytes: u64,
    /// Entries of any type, skipped ones included.
    pub max_entries: u64,
}

/// What an extraction did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtractSummary {
    /// Entries read (extracted or skipped).
    pub entries: u64,
    /// Bytes declared by the entries (file data written).
    pub bytes: u64,
    /// Entries not extracted: fifos, devices, unknown types.
    pub skipped: u64,
}

/// pax records and GNU long names one entry may carry.
const META_BUDGET: u64 = 1 << 20;

pub(super) fn extract_tar<R: Read>(
    root: &SandboxRoot,
    dir: &str,
    input: R,
    limits: ExtractLimits,
    filler: &mut dyn Filler,
) -> Result<ExtractSummary, RootfsError> {
    path::check(dir)?;
    let shown = show(dir.as_bytes());
    let created = root.missing_prefixes(dir);
    let top = root.ensure_dir(dir)?;
    let mut extraction = Extraction {
        root,
        top,
        top_path: dir.trim_end_matches('/').as_bytes().to_vec(),
        limits,
        summary: ExtractSummary::default(),
        filler,
        extracted: HashMap::new(),
        stages: Vec::new(),
    };
    let result = root
        .refuse_kernel_fs(extraction.top.as_fd(), &shown)
        .and_then(|()| {
            let top = reopen(extraction.top.as_fd(), &shown)?;
            extraction.stage_for(&[], top)
        })
        .and_then(|_| extraction.read(input))
        .and_then(|()| extraction.commit());
    extraction.discard();
    if result.is_err() {
        // The directories this request made, deepest first; each only if empty.
        for prefix in created.iter().rev() {
            let _ = root.remove(prefix, false);
        }
    }
    result.map(|()| extraction.summary)
}

/// A second descriptor for the directory `dir`.
fn reopen(dir: BorrowedFd<'_>, shown: &str) -> Result<OwnedFd, RootfsError> {
    fsops::openat2(dir, b".", PATH_DIR, BENEATH).map_err(|e| errno(e, "opening", shown))
}

/// Counts what the tar crate reads, and caps what it reads between entries
/// (headers, pax records, long names, the unread rest of the previous entry).
/// Shared by reference: the archive reads through it while its entries do.
struct Meter<R> {
    inner: RefCell<R>,
    pos: Cell<u64>,
    limit: Cell<u64>,
    over: Cell<bool>,
    /// The input itself failed (as opposed to holding a bad archive).
    failed: Cell<bool>,
    eof: Cell<bool>,
}

impl<R> Meter<R> {
    /// Allows what is left of the previous entry's data (which ends at
    /// `data_end`; what was read of it counts as read), then the budget.
    fn expect_headers(&self, data_end: u64) {
        self.limit
            .set(self.pos.get().max(data_end).saturating_add(META_BUDGET));
    }

    /// The error for an io error out of the tar crate.
    fn error(&self, e: io::Error, shown: &str, entry: Option<&str>) -> RootfsError {
        let at = entry
            .map(|e| format!(" at entry '{e}'"))
            .unwrap_or_default();
        if self.over.get() {
            RootfsError::TooLarge(format!(
                "{shown}: archive headers{at} over {} bytes (pax records, long names)",
                META_BUDGET
            ))
        } else if self.failed.get() {
            RootfsError::io(format!("reading the archive for {shown}"), e)
        } else {
            let detail = show(e.to_string().as_bytes());
            RootfsError::InvalidArchive(format!("{shown}: not a valid tar archive{at}: {detail}"))
        }
    }
}

impl<R: Read> Read for &Meter<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let room = self.limit.get().saturating_sub(self.pos.get());
        if room == 0 {
            self.over.set(true);
            return Err(io::Error::other("archive metadata over its limit"));
        }
        let len = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let Ok(mut inner) = self.inner.try_borrow_mut() else {
            return Err(io::Error::other("archive reader re-entered"));
        };
        let n = match inner.read(&mut buf[..len]) {
            Ok(n) => n,
            Err(e) => {
                if e.kind() != io::ErrorKind::Interrupted {
                    self.failed.set(true);
                }
                return Err(e);
            }
        };
        if n == 0 {
            self.eof.set(true);
        }
        self.pos.set(self.pos.get().saturating_add(n as u64));
        Ok(n)
    }
}

struct Extraction<'a> {
    root: &'a SandboxRoot,
    /// The extraction directory.
    top: OwnedFd,
    /// Its sandbox path without trailing slashes (empty for `/`), for
    /// messages.
    top_path: Vec<u8>,
    limits: ExtractLimits,
    summary: ExtractSummary,
    /// Writes the files' data (see [`Filler`]).
    filler: &'a mut dyn Filler,
    /// Files and symlinks extracted so far (`/`-joined names below the
    /// directory) and their inodes: the only hard link targets allowed.
    extracted: HashMap<Vec<u8>, NodeId>,
    /// Where the entries wait until the archive is accepted: the first is the
    /// extraction directory's, then one per mount below it that entries reach.
    stages: Vec<Stage>,
}

/// Entries bound for one mount, put together before they are moved into place:
/// `dir`, a directory of the daemon's own named `name` in `target`, the top
/// directory of that mount the extraction reaches (or the extraction directory
/// itself), so that moving them in is a rename within one filesystem.
struct Stage {
    /// The components from the extraction directory to `target`.
    at: Vec<Vec<u8>>,
    target: OwnedFd,
    dir: OwnedFd,
    name: Vec<u8>,
}

/// Where an entry's parent directory is: in stage `stage`, at the entry's
/// parent components from `start` on; `target` is the same directory in the
/// sandbox's tree as it is now, if there is one (and it is not to be replaced).
struct Spot {
    stage: usize,
    start: usize,
    target: Option<OwnedFd>,
}

impl Extraction<'_> {
    /// Reads the whole archive into the stages; every entry checked.
    fn read<R: Read>(&mut self, input: R) -> Result<(), RootfsError> {
        let shown = self.top_shown();
        let meter = Meter {
            inner: RefCell::new(BufReader::with_capacity(CHUNK, input)),
            pos: Cell::new(0),
            limit: Cell::new(META_BUDGET),
            over: Cell::new(false),
            failed: Cell::new(false),
            eof: Cell::new(false),
        };
        let mut archive = tar::Archive::new(&meter);
        let mut entries = archive
            .entries()
            .map_err(|e| meter.error(e, &shown, None))?;
        // Where the previous entry's data (and its padding) ends in the stream.
        let mut data_end = 0;
        loop {
            meter.expect_headers(data_end);
            let Some(entry) = entries.next() else { break };
            let mut entry = entry.map_err(|e| meter.error(e, &shown, None))?;
            data_end = meter
                .pos
                .get()
                .saturating_add(entry.size().saturating_add(511) & !511);
            // An entry's data is bounded by its declared size, which `add`
            // checks against the limits before reading any.
            meter.limit.set(u64::MAX);
            self.add(&mut entry, &meter)?;
        }
        // The tar crate stops at the zero block that ends an archive without
        // reading past it, and takes EOF where a header should be as the end
        // too: seeing EOF means the stream was cut between two entries.
        if meter.eof.get() {
            return Err(RootfsError::InvalidArchive(format!(
                "{shown}: the archive ends without an end-of-archive marker (truncated?)"
            )));
        }
        Ok(())
    }

    /// The stage of the mount whose top directory is `at` (components below the
    /// extraction directory), made on first use in `target`, that directory.
    fn stage_for(&mut self, at: &[&[u8]], target: OwnedFd) -> Result<usize, RootfsError> {
        if let Some(i) = self.stages.iter().position(|s| s.at == at) {
            return Ok(i);
        }
        let shown = self.shown(at);
        self.root.refuse_kernel_fs(target.as_fd(), &shown)?;
        let ((), name) = with_temp_name(&shown, |temp| {
            rustix::fs::mkdirat(&target, temp, Mode::from_bits_truncate(0o700))
        })?;
        let dir = match fsops::openat2(target.as_fd(), &name, PATH_DIR, BENEATH) {
            Ok(dir) => dir,
            Err(e) => {
                let _ = rustix::fs::unlinkat(&target, name.as_slice(), AtFlags::REMOVEDIR);
                return Err(errno(e, "creating a directory in", &shown));
            }
        };
        self.stages.push(Stage {
            at: at.iter().map(|c| c.to_vec()).collect(),
            target,
            dir,
            name,
        });
        Ok(self.stages.len() - 1)
    }

    /// Where the parent of an entry with parent components `parents` goes, read
    /// from the stages and the sandbox's tree as the entry will find them once
    /// the stage is moved in: a directory of the tree is merged into, anything
    /// else in the way is refused as it would be if the entry were written there
    /// at once (a symlink: `Escapes`; a file: `NotADirectory`), unless an earlier
    /// entry of the archive stands in its place. A mount's top directory
    /// switches to that mount's stage.
    fn locate(&mut self, parents: &[&[u8]], shown: &str) -> Result<Spot, RootfsError> {
        let top_shown = self.top_shown();
        let mut spot = Spot {
            stage: 0,
            start: 0,
            target: Some(reopen(self.top.as_fd(), &top_shown)?),
        };
        let mut staged = Some(reopen(self.stages[0].dir.as_fd(), &top_shown)?);
        for (i, &component) in parents.iter().enumerate() {
            let prefix = self.shown(&parents[..=i]);
            let in_target = match &spot.target {
                Some(dir) => fsops::stat_at_opt(dir.as_fd(), component)
                    .map_err(|e| errno(e, "inspecting", &prefix))?,
                None => None,
            };
            if let (Some(info), Some(dir)) = (in_target, &spot.target) {
                if info.mount_root && info.is_dir() {
                    let mount = fsops::openat2(dir.as_fd(), component, PATH_DIR, BENEATH)
                        .map_err(|e| errno(e, "opening", &prefix))?;
                    spot.stage = self.stage_for(&parents[..=i], mount)?;
                    spot.start = i + 1;
                    let stage = &self.stages[spot.stage];
                    spot.target = Some(reopen(stage.target.as_fd(), &prefix)?);
                    staged = Some(reopen(stage.dir.as_fd(), &prefix)?);
                    continue;
                }
            }
            let in_stage = match &staged {
                Some(dir) => fsops::stat_at_opt(dir.as_fd(), component)
                    .map_err(|e| errno(e, "inspecting", &prefix))?,
                None => None,
            };
            match in_stage {
                // An earlier entry is in the way: resolving in the stage says how.
                Some(info) if !info.is_dir() => {
                    spot.target = None;
                    return Ok(spot);
                }
                Some(_) => {
                    let dir = staged.as_ref().map(AsFd::as_fd).expect("staged");
                    staged = Some(
                        fsops::openat2(dir, component, PATH_DIR, BENEATH)
                            .map_err(|e| errno(e, "opening", &prefix))?,
                    );
                }
                None => staged = None,
            }
            spot.target = match (in_target, spot.target.take()) {
                (Some(info), Some(dir)) if info.is_dir() => Some(
                    fsops::openat2(dir.as_fd(), component, PATH_DIR, BENEATH)
                        .map_err(|e| errno(e, "opening", &prefix))?,
                ),
                (Some(info), Some(_)) if in_stage.is_none() => {
                    return Err(if info.file_type == FileType::Symlink {
                        RootfsError::Escapes(format!(
                            "{shown}: goes through the symlink {prefix} (archive entries never follow symlinks)"
                        ))
                    } else {
                        RootfsError::NotADirectory(format!("{shown}: {prefix} is not a directory"))
                    });
                }
                // Nothing there, or what is there is replaced by a staged directory.
                _ => None,
            };
        }
        Ok(spot)
    }

    /// Moves every stage into place, then removes the emptied stages.
    fn commit(&mut self) -> Result<(), RootfsError> {
        for stage in &self.stages {
            let at: Vec<&[u8]> = stage.at.iter().map(Vec::as_slice).collect();
            let mut shown = self.top_path.clone();
            for component in &at {
                shown.push(b'/');
                shown.extend_from_slice(component);
            }
            let dir = fsops::openat2(stage.dir.as_fd(), b".", READ_DIR, BENEATH)
                .map_err(|e| errno(e, "opening", &show(&shown)))?;
            merge(dir.as_fd(), stage.target.as_fd(), &mut shown, at.len())?;
        }
        Ok(())
    }

    /// Removes the stages and whatever is left in them.
    fn discard(&mut self) {
        for stage in self.stages.drain(..) {
            let mut shown = stage.name.clone();
            let mut budget = u64::MAX;
            if let Err(e) = super::remove_tree(
                stage.target.as_fd(),
                &stage.name,
                &mut shown,
                0,
                &mut budget,
            ) {
                tracing::warn!(error = %e, "cannot remove an archive's stage");
            }
        }
    }

    /// The sandbox path of the extraction directory, for messages.
    fn top_shown(&self) -> String {
        self.shown(&[])
    }

    /// The sandbox path of entry `components`, for messages.
    fn shown(&self, components: &[&[u8]]) -> String {
        if components.is_empty() && self.top_path.is_empty() {
            return "/".to_string();
        }
        let mut full = self.top_path.clone();
        for component in components {
            full.push(b'/');
            full.extend_from_slice(component);
        }
        show(&full)
    }

    fn add<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, &Meter<R>>,
        meter: &Meter<R>,
    ) -> Result<(), RootfsError> {
        let top_shown = self.top_shown();
        let raw = entry.path_bytes().into_owned();
        let raw_shown = show(&raw);
        self.summary.entries += 1;
        if self.summary.entries > self.limits.max_entries {
            return Err(RootfsError::TooLarge(format!(
                "{top_shown}: the archive has more than {} entries",
                self.limits.max_entries
            )));
        }
        let size = entry.size();
        match self.summary.bytes.checked_add(size) {
            Some(total) if total <= self.limits.max_bytes => self.summary.bytes = total,
            _ => {
                let max = self.limits.max_bytes;
                return Err(RootfsError::TooLarge(format!(
                    "{top_shown}: entry '{raw_shown}' ({size} bytes) takes the archive over {max} bytes"
                )));
            }
        }
        let mut kind = entry.header().entry_type();
        if kind == EntryType::XGlobalHeader {
            return Ok(());
        }
        // Pre-POSIX archives mark directories with a trailing slash only.
        if kind == EntryType::Regular && raw.ends_with(b"/") {
            kind = EntryType::Directory;
        }
        let components = path::archive_components(&raw)
            .map_err(|problem| name_refused(problem, &top_shown, &raw_shown, "name"))?;
        let Some((&name, parents)) = components.split_last() else {
            // `./`: the extraction directory itself, left as it is.
            if kind == EntryType::Directory {
                return Ok(());
            }
            return Err(RootfsError::InvalidArchive(format!(
                "{top_shown}: entry '{raw_shown}' names the extraction directory but is not a directory"
            )));
        };
        let shown = self.shown(&components);
        if components.len() > MAX_DEPTH {
            return Err(RootfsError::TooLarge(format!(
                "{shown}: nested more than {MAX_DEPTH} directories deep"
            )));
        }
        let key = components.join(&b'/');
        let mode = entry
            .header()
            .mode()
            .map_err(|e| meter.error(e, &top_shown, Some(&raw_shown)))?
            & MODE_MASK;
        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                let parent = self.replaceable_parent(parents, name, &shown)?;
                self.file(parent, name, key, mode, entry, meter, &shown)
            }
            EntryType::Directory => {
                let spot = self.locate(parents, &shown)?;
                if let Some(target) = &spot.target {
                    if let Some(info) = fsops::stat_at_opt(target.as_fd(), name)
                        .map_err(|e| errno(e, "inspecting", &shown))?
                    {
                        if info.mount_root && !info.is_dir() {
                            return Err(mount_point(&shown));
                        }
                    }
                }
                let parent = self.parent(&spot, parents, &shown, true)?;
                self.directory(parent.as_fd(), name, mode, &shown)
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .filter(|t| !t.is_empty() && !t.contains(&0))
                    .ok_or_else(|| {
                        RootfsError::InvalidArchive(format!(
                            "{shown}: symlink entry without a valid target"
                        ))
                    })?;
                let parent = self.replaceable_parent(parents, name, &shown)?;
                self.symlink(parent.as_fd(), name, key, &target, &shown)
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .ok_or_else(|| {
                        RootfsError::InvalidArchive(format!(
                            "{shown}: hard link entry without a target"
                        ))
                    })?;
                self.hardlink(parents, name, key, &target, &shown)
            }
            _ => {
                tracing::debug!(path = %shown, ?kind, "skipping an archive entry");
                self.summary.skipped += 1;
                Ok(())
            }
        }
    }

    /// The staged parent of a file, symlink or hard link `name` at `parents`,
    /// which may replace what the tree has there unless that is a directory or
    /// a mount point.
    fn replaceable_parent(
        &mut self,
        parents: &[&[u8]],
        name: &[u8],
        shown: &str,
    ) -> Result<OwnedFd, RootfsError> {
        let spot = self.locate(parents, shown)?;
        if let Some(target) = &spot.target {
            check_replaceable(target.as_fd(), name, shown)?;
        }
        self.parent(&spot, parents, shown, true)
    }

    /// Opens the staged directory `components` (below the extraction
    /// directory; `spot` says in which stage, from which component), creating
    /// missing ones if `create`. Never through a symlink.
    fn parent(
        &self,
        spot: &Spot,
        components: &[&[u8]],
        shown: &str,
        create: bool,
    ) -> Result<OwnedFd, RootfsError> {
        let stage = &self.stages[spot.stage];
        let below = &components[spot.start..];
        // The common case, a parent that exists, costs one call.
        let joined = below.join(&b'/');
        let joined: &[u8] = if joined.is_empty() { b"." } else { &joined };
        if let Ok(fd) = fsops::openat2(stage.dir.as_fd(), joined, PATH_DIR, BENEATH) {
            return Ok(fd);
        }
        let mut current = reopen(stage.dir.as_fd(), &self.top_shown())?;
        for (i, &component) in below.iter().enumerate() {
            let prefix = self.shown(&components[..=spot.start + i]);
            current = match fsops::openat2(current.as_fd(), component, PATH_DIR, BENEATH) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if create => {
                    self.root.refuse_kernel_fs(current.as_fd(), &prefix)?;
                    match self.root.make_dir(current.as_fd(), component, DIR_MODE) {
                        Ok(fd) => fd,
                        Err(e) => return Err(errno(e, "creating directory", &prefix)),
                    }
                }
                Err(e @ (Errno::LOOP | Errno::XDEV | Errno::NOTDIR)) => {
                    return Err(
                        match fsops::stat_at(current.as_fd(), component).map(|i| i.file_type) {
                            Ok(FileType::Symlink) => RootfsError::Escapes(format!(
                                "{shown}: goes through the symlink {prefix} (archive entries never follow symlinks)"
                            )),
                            Ok(_) => RootfsError::NotADirectory(format!(
                                "{shown}: {prefix} is not a directory"
                            )),
                            Err(_) => errno(e, "opening", &prefix),
                        },
                    )
                }
                Err(e) => return Err(errno(e, "opening", &prefix)),
            };
        }
        Ok(current)
    }

    #[allow(clippy::too_many_arguments)]
    fn file<R: Read>(
        &mut self,
        parent: OwnedFd,
        name: &[u8],
        key: Vec<u8>,
        mode: u32,
        entry: &mut tar::Entry<'_, &Meter<R>>,
        meter: &Meter<R>,
        shown: &str,
    ) -> Result<(), RootfsError> {
        let top_shown = self.top_shown();
        let mtime = entry.header().mtime().unwrap_or(0);
        let expected = entry.size();
        let mut writer = self
            .root
            .new_writer(parent, name, shown.to_string(), mode)?;
        let written = match writer.fill(&mut *self.filler, entry, Some(expected)) {
            Ok(written) => written,
            Err(FillError::Input(e)) => return Err(meter.error(e, &top_shown, Some(shown))),
            Err(FillError::Output(e)) => return Err(e),
        };
        if written != expected {
            // Dropping the writer removes the partial file.
            return Err(RootfsError::InvalidArchive(format!(
                "{shown}: the archive ends after {written} of {expected} bytes of this entry"
            )));
        }
        let time = Timespec {
            tv_sec: i64::try_from(mtime).unwrap_or(0),
            tv_nsec: 0,
        };
        let times = Timestamps {
            last_access: time,
            last_modification: time,
        };
        rustix::fs::futimens(writer.file(), &times)
            .map_err(|e| errno(e, "setting the times of", shown))?;
        let id = fsops::stat_fd(writer.file().as_fd())
            .map_err(|e| errno(e, "inspecting", shown))?
            .id;
        writer.commit()?;
        self.extracted.insert(key, id);
        Ok(())
    }

    fn directory(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        mode: u32,
        shown: &str,
    ) -> Result<(), RootfsError> {
        self.root.refuse_kernel_fs(parent, shown)?;
        match fsops::stat_at_opt(parent, name).map_err(|e| errno(e, "inspecting", shown))? {
            // Merged into; its owner and mode stay.
            Some(info) if info.is_dir() => return Ok(()),
            Some(info) if info.mount_root => return Err(mount_point(shown)),
            // A later entry replaces an earlier one (tar semantics); what is
            // replaced is only ever unlinked.
            Some(_) => rustix::fs::unlinkat(parent, name, AtFlags::empty())
                .map_err(|e| errno(e, "replacing", shown))?,
            None => {}
        }
        self.root
            .make_dir(parent, name, mode)
            .map(drop)
            .map_err(|e| errno(e, "creating directory", shown))
    }

    fn symlink(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        key: Vec<u8>,
        target: &[u8],
        shown: &str,
    ) -> Result<(), RootfsError> {
        self.root.refuse_kernel_fs(parent, shown)?;
        check_replaceable(parent, name, shown)?;
        let ((), temp) = with_temp_name(shown, |temp| rustix::fs::symlinkat(target, parent, temp))?;
        let placed = self.place(parent, &temp, name, shown, |root| {
            rustix::fs::chownat(
                parent,
                temp.as_slice(),
                Some(root.uid),
                Some(root.gid),
                AtFlags::SYMLINK_NOFOLLOW,
            )
        })?;
        self.extracted.insert(key, placed);
        Ok(())
    }

    fn hardlink(
        &mut self,
        parents: &[&[u8]],
        name: &[u8],
        key: Vec<u8>,
        raw_target: &[u8],
        shown: &str,
    ) -> Result<(), RootfsError> {
        let top_shown = self.top_shown();
        let target_shown = show(raw_target);
        let target = path::archive_components(raw_target).map_err(|problem| {
            name_refused(problem, &top_shown, &target_shown, "hard link target")
        })?;
        let target_key = target.join(&b'/');
        if target_key == key {
            return Ok(());
        }
        let not_earlier = || {
            RootfsError::InvalidArchive(format!(
                "{shown}: hard link to '{target_shown}', which is not an earlier file of this archive"
            ))
        };
        let expected = *self.extracted.get(&target_key).ok_or_else(not_earlier)?;
        let Some((&target_name, target_parents)) = target.split_last() else {
            return Err(not_earlier());
        };
        let target_spot = self.locate(target_parents, shown)?;
        let target_parent = self.parent(&target_spot, target_parents, shown, false)?;
        let same = |id: Result<NodeId, Errno>| id.is_ok_and(|id| id == expected);
        if !same(fsops::stat_at(target_parent.as_fd(), target_name).map(|i| i.id)) {
            return Err(RootfsError::InvalidArchive(format!(
                "{shown}: hard link target '{target_shown}' changed since it was extracted"
            )));
        }
        let parent = self.replaceable_parent(parents, name, shown)?;
        self.root.refuse_kernel_fs(parent.as_fd(), shown)?;
        check_replaceable(parent.as_fd(), name, shown)?;
        // No AT_SYMLINK_FOLLOW: a link to a symlink links the symlink.
        let ((), temp) = with_temp_name(shown, |temp| {
            rustix::fs::linkat(&target_parent, target_name, &parent, temp, AtFlags::empty())
        })?;
        // The sandbox could have swapped the target between the check and
        // the link: only the inode extracted earlier may be linked.
        if !same(fsops::stat_at(parent.as_fd(), temp.as_slice()).map(|i| i.id)) {
            let _ = rustix::fs::unlinkat(&parent, temp.as_slice(), AtFlags::empty());
            return Err(RootfsError::InvalidArchive(format!(
                "{shown}: hard link target '{target_shown}' changed since it was extracted"
            )));
        }
        let placed = self.place(parent.as_fd(), &temp, name, shown, |_| Ok(()))?;
        self.extracted.insert(key, placed);
        Ok(())
    }

    /// Finishes the temporary entry `temp` with `prepare`, then renames it
    /// over `name`; removes it on any failure. Returns its inode.
    fn place(
        &self,
        parent: BorrowedFd<'_>,
        temp: &[u8],
        name: &[u8],
        shown: &str,
        prepare: impl FnOnce(&SandboxRoot) -> Result<(), Errno>,
    ) -> Result<NodeId, RootfsError> {
        let result = prepare(self.root)
            .map_err(|e| errno(e, "creating", shown))
            .and_then(|()| fsops::stat_at(parent, temp).map_err(|e| errno(e, "inspecting", shown)))
            .and_then(|info| {
                check_replaceable(parent, name, shown)?;
                rustix::fs::renameat(parent, temp, parent, name)
                    .map_err(|e| errno(e, "replacing", shown))?;
                Ok(info.id)
            });
        if result.is_err() {
            let _ = rustix::fs::unlinkat(parent, temp, AtFlags::empty());
        }
        result
    }
}

/// Moves the staged entries of `staged` into `target`: a directory where the
/// tree has one is merged into it (the tree's keeps its owner and mode), anything
/// else is renamed over what is there; a directory of the tree is never replaced
/// by a non-directory, nor is a mount point. `shown` is the sandbox path of
/// `target`; `depth` its depth below the extraction directory. The staged names
/// are read a buffer at a time, in passes until none is left.
fn merge(
    staged: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    shown: &mut Vec<u8>,
    depth: usize,
) -> Result<(), RootfsError> {
    if depth > MAX_DEPTH {
        return Err(RootfsError::TooLarge(format!(
            "{}: nested more than {MAX_DEPTH} directories deep",
            show(shown)
        )));
    }
    loop {
        let mut found = false;
        fsops::each_name(staged, |name| {
            found = true;
            let len = shown.len();
            shown.push(b'/');
            shown.extend_from_slice(name);
            let result = merge_entry(staged, target, name, shown, depth);
            shown.truncate(len);
            result.map(|()| ControlFlow::Continue(()))
        })
        .map_err(|stopped| match stopped {
            Stopped::Listing(e) => errno(e, "listing", &show(shown)),
            Stopped::By(e) => e,
        })?;
        if !found {
            return Ok(());
        }
    }
}

fn merge_entry(
    staged: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    name: &[u8],
    shown: &mut Vec<u8>,
    depth: usize,
) -> Result<(), RootfsError> {
    let here = show(shown);
    let fail = |e: Errno, what: &str| errno(e, what, &here);
    let entry = fsops::stat_at(staged, name).map_err(|e| fail(e, "inspecting"))?;
    match fsops::stat_at_opt(target, name).map_err(|e| fail(e, "inspecting"))? {
        Some(there) if there.mount_root && !there.is_dir() => return Err(mount_point(&here)),
        Some(there) if there.is_dir() && entry.is_dir() => {
            let from = fsops::openat2(staged, name, READ_DIR | OFlags::NOFOLLOW, BENEATH)
                .map_err(|e| fail(e, "opening"))?;
            let into =
                fsops::openat2(target, name, PATH_DIR, BENEATH).map_err(|e| fail(e, "opening"))?;
            merge(from.as_fd(), into.as_fd(), shown, depth + 1)?;
            return rustix::fs::unlinkat(staged, name, AtFlags::REMOVEDIR)
                .map_err(|e| fail(e, "removing"));
        }
        // Checked when the entry was staged: the sandbox made it one since.
        Some(there) if there.is_dir() => {
            return Err(RootfsError::NotAFile(format!("{here}: is a directory")))
        }
        // A directory replaces what is not one (tar semantics); rename cannot.
        Some(_) if entry.is_dir() => {
            rustix::fs::unlinkat(target, name, AtFlags::empty())
                .map_err(|e| fail(e, "replacing"))?;
        }
        _ => {}
    }
    rustix::fs::renameat(staged, name, target, name).map_err(|e| fail(e, "replacing"))
}

fn name_refused(
    problem: ArchivePathError,
    top_shown: &str,
    raw_shown: &str,
    role: &str,
) -> RootfsError {
    let at = format!("{top_shown}: archive entry '{raw_shown}'");
    match problem {
        ArchivePathError::Absolute => RootfsError::Escapes(format!("{at}: the {role} is absolute")),
        ArchivePathError::DotDot => RootfsError::Escapes(format!("{at}: the {role} contains '..'")),
        ArchivePathError::Nul => {
            RootfsError::InvalidArchive(format!("{at}: the {role} contains a NUL byte"))
        }
        ArchivePathError::TooLong => RootfsError::InvalidArchive(format!(
            "{at}: the {role} is longer than {} bytes",
            path::MAX_PATH
        )),
    }
}
