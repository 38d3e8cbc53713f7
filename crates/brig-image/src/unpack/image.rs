//! What OCI layouts and docker-save archives share: the image config blob and
//! the walk over layer blobs.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::digest::{Digest, Hashing};
use super::source::Files;
use super::{drain, extract, within, StagedLayer};
use crate::{ImageConfig, ImageError, IoContext, Progress, Result};

/// The parts of an OCI (or docker) image config brig uses.
#[derive(Deserialize)]
struct ConfigBlob {
    #[serde(default)]
    config: Option<RunConfig>,
    #[serde(default)]
    rootfs: Option<RootFs>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RunConfig {
    env: Option<Vec<String>>,
    user: Option<String>,
    working_dir: Option<String>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

pub(crate) struct Config {
    pub run: ImageConfig,
    /// Digests of the uncompressed layers, bottom first; empty if not given.
    pub diff_ids: Vec<Digest>,
}

pub(crate) fn read_config(files: &Files, name: &str, digest: Option<&Digest>) -> Result<Config> {
    let blob: ConfigBlob = files.read_json(name, digest)?;
    let run = blob.config.unwrap_or_default();
    let diff_ids = blob
        .rootfs
        .map(|rootfs| rootfs.diff_ids)
        .unwrap_or_default()
        .iter()
        .map(|id| Digest::parse(id).map_err(|e| files.bad(format!("{name}: diff_ids: {e}"))))
        .collect::<Result<_>>()?;
    // Docker writes "" for unset strings.
    let set = |s: Option<String>| s.filter(|s| !s.is_empty());
    Ok(Config {
        run: ImageConfig {
            env: run.env.unwrap_or_default(),
            user: set(run.user),
            workdir: set(run.working_dir),
            entrypoint: run.entrypoint.unwrap_or_default(),
            cmd: run.cmd.unwrap_or_default(),
        },
        diff_ids,
    })
}

/// A layer blob to unpack and what it must match.
pub(crate) struct LayerBlob {
    pub name: String,
    pub digest: Option<Digest>,
    pub size: Option<u64>,
}

/// Extracts `blobs` into `staging/layer-N`, checking each against its digest
/// and size and, when the config lists them, its diff_id.
pub(crate) fn unpack_layers(
    files: &Files,
    blobs: &[LayerBlob],
    diff_ids: &[Digest],
    staging: &Path,
    progress: &dyn Progress,
) -> Result<Vec<StagedLayer>> {
    if !diff_ids.is_empty() && diff_ids.len() != blobs.len() {
        return Err(files.bad(format!(
            "the image config lists {} layers but the manifest {}",
            diff_ids.len(),
            blobs.len()
        )));
    }
    let total = blobs.len();
    let mut buf = vec![0; 64 * 1024];
    let mut staged = Vec::with_capacity(total);
    for (i, blob) in blobs.iter().enumerate() {
        if progress.cancelled() {
            return Err(ImageError::Interrupted);
        }
        let place = format!(
            "{}: layer {}/{total} ({})",
            files.source().display(),
            i + 1,
            blob.name
        );
        let bad = |message: String| ImageError::BadSource(format!("{place}: {message}"));
        let (reader, size) = files.open(&blob.name)?;
        if let Some(expected) = blob.size.filter(|&expected| expected != size) {
            return Err(bad(format!(
                "the blob is {size} bytes, the manifest says {expected}"
            )));
        }
        let dest = layer_dir(staging, i)?;
        progress.phase(&format!("unpack layer {}/{total}", i + 1), Some(size));
        let mut blob_reader = Hashing::new(reader);
        let diff_id =
            extract::extract(&mut blob_reader, &dest, progress).map_err(|e| within(&place, e))?;
        // Bytes the decompressor left unread are part of the blob all the same.
        drain(&mut blob_reader, &mut buf, progress).map_err(|e| within(&place, e))?;
        if let Some(expected) = &blob.digest {
            let actual = blob_reader.digest();
            if actual != *expected {
                return Err(bad(format!(
                    "content does not match its digest {expected} (it is {actual})"
                )));
            }
        }
        if let Some(expected) = diff_ids.get(i).filter(|&expected| *expected != diff_id) {
            return Err(bad(format!(
                "uncompressed content does not match the config's diff_id {expected} (it is {diff_id})"
            )));
        }
        staged.push(StagedLayer {
            path: dest,
            borrowed: false,
        });
    }
    Ok(staged)
}

/// Creates `staging/layer-<index>`.
pub(crate) fn layer_dir(staging: &Path, index: usize) -> Result<PathBuf> {
    let dir = staging.join(format!("layer-{index}"));
    fs::create_dir(&dir).context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
