//! The canonical content digest of one layer tree (format in the module docs).

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{scan, Kind, Metadata};
use crate::{ImageError, IoContext, Progress, Result};

/// Names the serialization, so a future change cannot collide with this one.
const VERSION: &[u8] = b"brig-tree-v1";

const CHUNK: usize = 1 << 20;

/// The canonical digest of the layer tree at `root`: `sha256:<64 hex digits>`.
///
/// Reports the bytes of file contents hashed to `progress` and stops with
/// [`ImageError::Interrupted`] when it is cancelled.
pub fn digest(root: &Path, progress: &dyn Progress) -> Result<String> {
    digest_excluding(root, &[], progress)
}

/// [`digest`] of the tree without the entries at `exclude` (paths relative to
/// `root`) and everything below them: the digest of what a layer packed with the
/// same exclusions holds. A tree with a name longer than a layer can hold
/// ([`crate::pack::MAX_NAME_BYTES`]) is refused, naming its path.
pub fn digest_excluding(
    root: &Path,
    exclude: &[PathBuf],
    progress: &dyn Progress,
) -> Result<String> {
    let mut out = Sha256::new();
    serialize(root, exclude, progress, &mut out)?;
    Ok(format!("sha256:{}", hex::encode(out.finalize())))
}

/// Where the serialization goes: the hasher, or a buffer in tests.
pub(super) trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

struct Encoder<'a, S>(&'a mut S);

impl<S: Sink> Encoder<'_, S> {
    fn raw(&mut self, b: &[u8]) {
        self.0.put(b);
    }

    fn u64(&mut self, n: u64) {
        self.0.put(&n.to_be_bytes());
    }

    fn i64(&mut self, n: i64) {
        self.0.put(&n.to_be_bytes());
    }

    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.raw(b);
    }
}

/// Writes the canonical serialization of the tree at `root` to `out`.
pub(super) fn serialize(
    root: &Path,
    exclude: &[PathBuf],
    progress: &dyn Progress,
    out: &mut impl Sink,
) -> Result<()> {
    let mut enc = Encoder(out);
    enc.bytes(VERSION);
    let mut buf = vec![0; CHUNK];
    scan::walk(root, |rel, full, st| {
        if progress.cancelled() {
            return Err(ImageError::Interrupted);
        }
        if exclude.iter().any(|x| x == rel) {
            return Ok(false);
        }
        check_name(rel)?;
        let meta = Metadata::read(full, st)?;
        enc.bytes(rel.as_os_str().as_bytes());
        enc.raw(&[meta.kind.letter()]);
        enc.u64(meta.mode.into());
        enc.u64(meta.uid.into());
        enc.u64(meta.gid.into());
        enc.i64(meta.mtime);
        enc.u64(meta.mtime_nsec.into());
        match meta.kind {
            Kind::File => {
                enc.u64(meta.size);
                enc.raw(&hash_file(full, st, progress, &mut buf)?);
            }
            Kind::Symlink => {
                let target = meta.target.as_deref().unwrap_or(Path::new(""));
                enc.bytes(target.as_os_str().as_bytes());
            }
            Kind::CharDevice | Kind::BlockDevice => {
                let (major, minor) = meta.device.unwrap_or_default();
                enc.u64(major.into());
                enc.u64(minor.into());
            }
            Kind::Dir | Kind::Fifo | Kind::Socket => {}
        }
        enc.u64(meta.xattrs.len() as u64);
        for (name, value) in &meta.xattrs {
            enc.bytes(name.as_bytes());
            enc.bytes(value);
        }
        Ok(true)
    })
}

/// Refuses a name a layer cannot hold, showing at most the start of its path.
fn check_name(rel: &Path) -> Result<()> {
    let Some(name) = rel.file_name() else {
        return Ok(());
    };
    let len = name.as_bytes().len();
    if len <= crate::pack::MAX_NAME_BYTES {
        return Ok(());
    }
    const SHOWN: usize = 80;
    let path = rel.to_string_lossy();
    let shown = match path.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &path[..cut]),
        None => path.into_owned(),
    };
    Err(ImageError::Unsupported(format!(
        "/{shown}: a name of {len} bytes, longer than an image layer holds (at most {} bytes)",
        crate::pack::MAX_NAME_BYTES
    )))
}

/// The SHA-256 of the contents of the regular file `path`, whose `lstat` is `st`.
fn hash_file(
    path: &Path,
    st: &std::fs::Metadata,
    progress: &dyn Progress,
    buf: &mut [u8],
) -> Result<[u8; 32]> {
    let size = st.size();
    let mut file = scan::open_file(path, st)?;
    let mut hasher = Sha256::new();
    let mut read = 0u64;
    loop {
        let n = file
            .read(buf)
            .context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        read += n as u64;
        progress.advance(n as u64);
        // Large files are worth interrupting in the middle.
        if progress.cancelled() {
            return Err(ImageError::Interrupted);
        }
    }
    // The record carries the size from the metadata; contents of another
    // length would make a digest no tree has.
    if read != size {
        return Err(ImageError::io(
            format!("reading {}", path.display()),
            std::io::Error::other(format!(
                "the file changed while it was hashed ({size} bytes expected, {read} read)"
            )),
        ));
    }
    Ok(hasher.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_is_big_endian_and_length_prefixed() {
        let mut out = Vec::new();
        let mut enc = Encoder(&mut out);
        enc.u64(0x0102);
        enc.i64(-1);
        enc.bytes(b"ab");
        assert_eq!(
            out,
            [
                &[0, 0, 0, 0, 0, 0, 1, 2][..],
                &[0xff; 8],
                &[0, 0, 0, 0, 0, 0, 0, 2],
                b"ab"
            ]
            .concat()
        );
    }

    #[test]
    fn empty_root_serializes_to_header_and_one_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut out = Vec::new();
        serialize(dir.path(), &[], &crate::Silent, &mut out).unwrap();
        // header (8 + 12) + path (8) + type (1) + mode, uid, gid, sec, nsec (40)
        // + xattr count (8); the temp dir has no content xattrs.
        assert_eq!(out.len(), 20 + 8 + 1 + 40 + 8);
        assert_eq!(&out[8..20], VERSION);
        assert_eq!(out[28], b'd');
    }

    #[test]
    fn a_non_directory_root_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let err = digest(&file, &crate::Silent).unwrap_err();
        assert_eq!(err.code(), "bad_source");
    }
}
