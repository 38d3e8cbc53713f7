//! Image sources to staged layer trees.
//!
//! [`unpack`] turns a directory, a rootfs tarball, an OCI image layout (a
//! directory, or a tar of one) or a `docker save` archive into one directory
//! per layer, bottom first, in the overlayfs layer format (with `userxattr`),
//! plus the image's run config.
//!
//! Sources are hostile and this runs as host root: nothing is ever written
//! outside the staging directory (see `beneath`), blobs are checked against
//! their digests, and anything malformed is [`ImageError::BadSource`].

pub(crate) mod beneath;
mod compress;
mod digest;
mod docker;
mod extract;
mod image;
mod oci;
mod source;

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

pub use extract::extract_layer;

use crate::{ImageConfig, ImageError, IoContext, Progress, Result};
use source::Files;

/// What kind of image source a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// A root file system tree, used in place as the only layer.
    Directory,
    /// A tar archive (plain, gzip or zstd) of a root file system.
    Tar,
    /// An OCI image layout: a directory, or a tar archive of one.
    OciLayout,
    /// A `docker save` archive.
    DockerArchive,
}

/// One layer tree, ready to be packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedLayer {
    pub path: PathBuf,
    /// The caller's own directory (a `Directory` source): never delete it.
    pub borrowed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpacked {
    /// Bottom layer first.
    pub layers: Vec<StagedLayer>,
    pub config: ImageConfig,
}

/// Tells what kind of source `source` is, from its content rather than its
/// name: a directory with an `oci-layout` file is an OCI layout; a tar archive
/// (compression recognised by magic bytes) is a docker-save archive if it has
/// a top-level `manifest.json` (docker 25+ writes an OCI layout alongside, but
/// the docker manifest is the one its tooling reads), an OCI layout if it has
/// `oci-layout` and `index.json`, and a rootfs tarball otherwise.
pub fn detect(source: &Path) -> Result<SourceKind> {
    let meta = fs::metadata(source).context(|| format!("reading {}", source.display()))?;
    if meta.is_dir() {
        return Ok(if source.join("oci-layout").is_file() {
            SourceKind::OciLayout
        } else {
            SourceKind::Directory
        });
    }
    if !meta.is_file() {
        return Err(ImageError::BadSource(format!(
            "{}: not a directory or a regular file",
            source.display()
        )));
    }
    let markers = source::scan_markers(source)?;
    Ok(if markers.manifest_json {
        SourceKind::DockerArchive
    } else if markers.oci_layout && markers.index_json {
        SourceKind::OciLayout
    } else {
        SourceKind::Tar
    })
}

/// Unpacks `source` into `staging` (an existing empty directory on the store's
/// file system), one `layer-N` directory per layer.
///
/// Nothing is written outside `staging`. On error `staging` holds partial
/// results and is the caller's to delete.
pub fn unpack(source: &Path, staging: &Path, progress: &dyn Progress) -> Result<Unpacked> {
    match detect(source)? {
        SourceKind::Directory => {
            let path =
                fs::canonicalize(source).context(|| format!("resolving {}", source.display()))?;
            Ok(Unpacked {
                layers: vec![StagedLayer {
                    path,
                    borrowed: true,
                }],
                config: ImageConfig::default(),
            })
        }
        SourceKind::Tar => {
            let mut file =
                File::open(source).context(|| format!("opening {}", source.display()))?;
            let size = file
                .metadata()
                .context(|| format!("reading {}", source.display()))?
                .len();
            let dest = image::layer_dir(staging, 0)?;
            progress.phase("unpack layer 1/1", Some(size));
            extract::extract(&mut file, &dest, progress)
                .map_err(|e| within(&source.display().to_string(), e))?;
            Ok(Unpacked {
                layers: vec![StagedLayer {
                    path: dest,
                    borrowed: false,
                }],
                config: ImageConfig::default(),
            })
        }
        SourceKind::OciLayout => {
            let files = if source.is_dir() {
                Files::dir(source)?
            } else {
                Files::tar(source, staging, progress)?
            };
            oci::unpack(&files, staging, progress)
        }
        SourceKind::DockerArchive => {
            let files = Files::tar(source, staging, progress)?;
            docker::unpack(&files, staging, progress)
        }
    }
}

/// Reading a source failed: the OS failing is an I/O error; anything else (a
/// decoder or the tar parser refusing the bytes) means the source is corrupt.
fn read_error(err: io::Error) -> ImageError {
    if err.raw_os_error().is_some() {
        ImageError::io("reading the source", err)
    } else {
        ImageError::BadSource(format!("corrupt or truncated archive: {err}"))
    }
}

/// Prefixes an error's message with where it happened.
fn within(place: &str, err: ImageError) -> ImageError {
    match err {
        ImageError::BadSource(message) => ImageError::BadSource(format!("{place}: {message}")),
        ImageError::Unsupported(message) => ImageError::Unsupported(format!("{place}: {message}")),
        ImageError::Io { context, source } => ImageError::Io {
            context: format!("{place}: {context}"),
            source,
        },
        other => other,
    }
}

/// Reports every byte read through it as progress.
struct Counting<'p, R> {
    inner: R,
    progress: &'p dyn Progress,
}

impl<'p, R> Counting<'p, R> {
    fn new(inner: R, progress: &'p dyn Progress) -> Self {
        Counting { inner, progress }
    }
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 {
            self.progress.advance(n as u64);
        }
        Ok(n)
    }
}

/// Reads `reader` to its end, staying cancellable.
fn drain(reader: &mut impl Read, buf: &mut [u8], progress: &dyn Progress) -> Result<()> {
    loop {
        if progress.cancelled() {
            return Err(ImageError::Interrupted);
        }
        match reader.read(buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_error(e)),
        }
    }
}
