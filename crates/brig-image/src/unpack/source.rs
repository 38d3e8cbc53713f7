//! The files of an OCI layout or a docker-save archive, by relative path,
//! whether they sit in a directory or inside a tar archive.
//!
//! A tar archive is indexed rather than extracted: blobs are read in place,
//! so the outer archive is never written anywhere. A compressed one is first
//! decompressed to an unlinked file in staging, because the manifest that
//! says which blobs to read may come last.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use serde::de::DeserializeOwned;
use tar::EntryType;

use super::compress::{Compression, Sniffed};
use super::digest::Digest;
use super::{read_error, within, Counting};
use crate::{ImageError, IoContext, Progress, Result};

/// Manifests, indexes and configs are small; a bigger one is hostile.
const MAX_METADATA: u64 = 16 << 20;
/// Symlink hops followed inside an archive before giving up.
const MAX_LINKS: usize = 16;

pub(crate) struct Files {
    source: PathBuf,
    kind: Kind,
}

enum Kind {
    Dir(OwnedFd),
    Tar {
        file: File,
        len: u64,
        members: HashMap<String, Member>,
    },
}

enum Member {
    File {
        offset: u64,
        size: u64,
    },
    /// A symlink or hard link, by the normalised path it points to.
    Link(String),
    Other,
}

impl Files {
    pub fn dir(source: &Path) -> Result<Files> {
        let root = rustix::fs::open(
            source,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .context(|| format!("opening {}", source.display()))?;
        Ok(Files {
            source: source.to_path_buf(),
            kind: Kind::Dir(root),
        })
    }

    pub fn tar(source: &Path, staging: &Path, progress: &dyn Progress) -> Result<Files> {
        let at = |e| within(&source.display().to_string(), e);
        let mut file = File::open(source).context(|| format!("opening {}", source.display()))?;
        let compression = Sniffed::new(BufReader::new(&file))
            .map_err(|e| at(e.into()))?
            .kind;
        if compression != Compression::None {
            file = decompress_to_staging(source, file, staging, progress).map_err(at)?;
        }
        let len = file
            .metadata()
            .context(|| format!("reading {}", source.display()))?
            .len();
        let members = index(&file, progress).map_err(at)?;
        Ok(Files {
            source: source.to_path_buf(),
            kind: Kind::Tar { file, len, members },
        })
    }

    /// The source, for messages.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Opens `name` (relative, `/`-separated) and returns it with its size.
    pub fn open(&self, name: &str) -> Result<(Box<dyn Read + '_>, u64)> {
        let missing = || self.bad(format!("{name} is missing"));
        let Some(path) = normalize(name.as_bytes()) else {
            return Err(missing());
        };
        match &self.kind {
            Kind::Dir(root) => {
                // Symlinks are allowed, but only to files inside the layout.
                let opened = brig_sys::resolve::openat2(
                    root,
                    path.as_str(),
                    OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
                    Mode::empty(),
                    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
                );
                let fd = match opened {
                    Err(rustix::io::Errno::NOENT) => return Err(missing()),
                    Err(rustix::io::Errno::XDEV) => {
                        return Err(self.bad(format!("{name} resolves outside the directory")))
                    }
                    other => {
                        other.context(|| format!("opening {name} in {}", self.source.display()))?
                    }
                };
                let file = File::from(fd);
                let meta = file
                    .metadata()
                    .context(|| format!("reading {name} in {}", self.source.display()))?;
                if !meta.is_file() {
                    return Err(self.bad(format!("{name} is not a regular file")));
                }
                Ok((Box::new(file), meta.len()))
            }
            Kind::Tar { file, len, members } => {
                let mut current = path;
                for _ in 0..MAX_LINKS {
                    match members.get(&current) {
                        Some(&Member::File { offset, size }) => {
                            // Indexing seeks over member data, so a cut-off
                            // archive only shows here.
                            let end = match offset.checked_add(size) {
                                Some(end) if end <= *len => end,
                                _ => return Err(self.bad(format!("{name} is truncated"))),
                            };
                            let section = Section {
                                file,
                                pos: offset,
                                end,
                            };
                            return Ok((Box::new(section), size));
                        }
                        Some(Member::Link(target)) => current = target.clone(),
                        Some(Member::Other) | None => return Err(missing()),
                    }
                }
                Err(self.bad(format!("{name}: too many levels of links")))
            }
        }
    }

    /// Reads a small file whole, checking it against `digest` if given.
    pub fn read(&self, name: &str, digest: Option<&Digest>) -> Result<Vec<u8>> {
        let (mut reader, size) = self.open(name)?;
        if size > MAX_METADATA {
            return Err(self.bad(format!(
                "{name} is {size} bytes, too large for image metadata"
            )));
        }
        let mut data = Vec::with_capacity(size as usize);
        reader
            .read_to_end(&mut data)
            .map_err(|e| within(&format!("{}: {name}", self.source.display()), read_error(e)))?;
        if let Some(expected) = digest {
            let actual = Digest::of(&data);
            if actual != *expected {
                return Err(self.bad(format!(
                    "{name} does not match its digest {expected} (its content is {actual})"
                )));
            }
        }
        Ok(data)
    }

    /// Reads and parses a small JSON file, checking it against `digest` if given.
    pub fn read_json<T: DeserializeOwned>(&self, name: &str, digest: Option<&Digest>) -> Result<T> {
        let data = self.read(name, digest)?;
        serde_json::from_slice(&data).map_err(|e| self.bad(format!("{name}: invalid JSON: {e}")))
    }

    pub fn bad(&self, message: impl std::fmt::Display) -> ImageError {
        ImageError::BadSource(format!("{}: {message}", self.source.display()))
    }
}

/// A member's bytes inside the archive file.
struct Section<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for Section<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = usize::try_from(self.end - self.pos).unwrap_or(usize::MAX);
        let want = buf.len().min(left);
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "archive member is truncated",
            ));
        }
        self.pos += n as u64;
        Ok(n)
    }
}

/// Writes the decompressed archive to staging and returns it open, already
/// unlinked so that nothing is left behind whatever happens next.
fn decompress_to_staging(
    source: &Path,
    mut file: File,
    staging: &Path,
    progress: &dyn Progress,
) -> Result<File> {
    file.seek(SeekFrom::Start(0))
        .context(|| format!("reading {}", source.display()))?;
    let size = file
        .metadata()
        .context(|| format!("reading {}", source.display()))?
        .len();
    let temp = staging.join(".source.tar");
    let mut out = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&temp)
        .context(|| format!("creating {}", temp.display()))?;
    std::fs::remove_file(&temp).context(|| format!("removing {}", temp.display()))?;

    progress.phase("decompress", Some(size));
    let counted = BufReader::new(Counting::new(file, progress));
    let mut decoder = Sniffed::new(counted)?
        .decoder()
        .context(|| "starting the decompressor".to_string())?;
    let mut buf = vec![0; 128 * 1024];
    let (mut written, mut ends_in_hole) = (0u64, false);
    loop {
        if progress.cancelled() {
            return Err(ImageError::Interrupted);
        }
        let n = match decoder.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_error(e)),
        };
        // A small archive can decompress to gigabytes of zeros: they stay holes.
        ends_in_hole = brig_sys::sparse::write_keeping_holes(&mut out, &buf[..n], written)
            .context(|| format!("writing {}", temp.display()))?;
        written += n as u64;
    }
    if ends_in_hole {
        out.set_len(written)
            .context(|| format!("writing {}", temp.display()))?;
    }
    Ok(out)
}

/// Where each member of the archive is; later members replace earlier ones.
fn index(file: &File, progress: &dyn Progress) -> Result<HashMap<String, Member>> {
    let mut reader = file;
    reader.seek(SeekFrom::Start(0)).map_err(read_error)?;
    let mut archive = tar::Archive::new(reader);
    let mut members = HashMap::new();
    for entry in archive.entries_with_seek().map_err(read_error)? {
        if progress.cancelled() {
            return Err(ImageError::Interrupted);
        }
        let entry = entry.map_err(read_error)?;
        let Some(name) = normalize(&entry.path_bytes()) else {
            continue;
        };
        let member = match entry.header().entry_type() {
            EntryType::Regular | EntryType::Continuous => Member::File {
                offset: entry.raw_file_position(),
                size: entry.size(),
            },
            // Older docker saves link repeated layers to their first copy.
            EntryType::Symlink => entry
                .link_name_bytes()
                .and_then(|target| resolve_symlink(&name, &target))
                .map_or(Member::Other, Member::Link),
            EntryType::Link => entry
                .link_name_bytes()
                .and_then(|target| normalize(&target))
                .map_or(Member::Other, Member::Link),
            _ => Member::Other,
        };
        members.insert(name, member);
    }
    Ok(members)
}

/// Which top-level files an archive has, for [`super::detect`].
#[derive(Debug, Default)]
pub(crate) struct Markers {
    pub manifest_json: bool,
    pub oci_layout: bool,
    pub index_json: bool,
}

pub(crate) fn scan_markers(source: &Path) -> Result<Markers> {
    let at = |e| within(&source.display().to_string(), e);
    let mut file = File::open(source).context(|| format!("opening {}", source.display()))?;
    let sniffed = Sniffed::new(BufReader::new(&file)).map_err(|e| at(e.into()))?;
    let mut markers = Markers::default();
    if sniffed.kind == Compression::None {
        // Plain: seeking past the data makes this cheap even for big archives.
        drop(sniffed);
        file.seek(SeekFrom::Start(0))
            .context(|| format!("reading {}", source.display()))?;
        let mut archive = tar::Archive::new(&file);
        let entries = archive.entries_with_seek().map_err(|e| at(read_error(e)))?;
        scan(entries, &mut markers).map_err(at)?;
    } else {
        let decoder = sniffed
            .decoder()
            .context(|| "starting the decompressor".to_string())
            .map_err(at)?;
        let mut archive = tar::Archive::new(decoder);
        let entries = archive.entries().map_err(|e| at(read_error(e)))?;
        scan(entries, &mut markers).map_err(at)?;
    }
    Ok(markers)
}

fn scan<R: Read>(entries: tar::Entries<'_, R>, markers: &mut Markers) -> Result<()> {
    for entry in entries {
        let entry = entry.map_err(read_error)?;
        if entry.header().entry_type().is_dir() {
            continue;
        }
        match normalize(&entry.path_bytes()).as_deref() {
            Some("manifest.json") => {
                markers.manifest_json = true;
                // Decisive whatever else is in there.
                return Ok(());
            }
            Some("oci-layout") => markers.oci_layout = true,
            Some("index.json") => markers.index_json = true,
            _ => {}
        }
    }
    Ok(())
}

/// `./a//b/` -> `a/b`; `..` climbs (these paths are looked up, never written).
/// `None` for paths that climb above the top or are not UTF-8 (JSON cannot
/// name them).
fn normalize(path: &[u8]) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in std::str::from_utf8(path).ok()?.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            _ => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// The member a symlink named `link` points to.
fn resolve_symlink(link: &str, target: &[u8]) -> Option<String> {
    let dir = link.rsplit_once('/').map_or("", |(dir, _)| dir);
    if target.starts_with(b"/") {
        normalize(target)
    } else {
        normalize(format!("{dir}/{}", std::str::from_utf8(target).ok()?).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_are_normalised() {
        assert_eq!(
            normalize(b"./blobs//sha256/ab/").as_deref(),
            Some("blobs/sha256/ab")
        );
        assert_eq!(normalize(b"a/../b").as_deref(), Some("b"));
        assert_eq!(normalize(b"../b"), None);
        assert_eq!(
            resolve_symlink("abc/layer.tar", b"../blobs/sha256/x").as_deref(),
            Some("blobs/sha256/x")
        );
        assert_eq!(resolve_symlink("l", b"/x/y").as_deref(), Some("x/y"));
    }

    #[test]
    fn zeros_decompressed_to_staging_stay_holes() {
        use std::io::Write;
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("zeros.gz");
        let mut gz = flate2::write::GzEncoder::new(
            File::create(&source).unwrap(),
            flate2::Compression::fast(),
        );
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..256 {
            gz.write_all(&zeros).unwrap();
        }
        gz.write_all(b"tail").unwrap();
        gz.finish().unwrap();
        let staged = decompress_to_staging(
            &source,
            File::open(&source).unwrap(),
            dir.path(),
            &crate::progress::Silent,
        )
        .unwrap();
        let meta = staged.metadata().unwrap();
        assert_eq!(meta.len(), (256 << 20) + 4);
        assert!(meta.blocks() * 512 <= 64 << 10, "{} blocks", meta.blocks());
    }
}
