//! `docker save` archives: `manifest.json` names the config and the layers.
//!
//! Before docker 25 layers are `<id>/layer.tar` and the config `<digest>.json`;
//! since, both are OCI blobs (`blobs/sha256/<digest>`). A layer's directory
//! id is not a content digest, so those layers are checked against the
//! config's diff_ids instead.

use std::path::Path;

use serde::Deserialize;

use super::digest::Digest;
use super::image::{self, LayerBlob};
use super::source::Files;
use super::Unpacked;
use crate::{Progress, Result};

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Image {
    config: String,
    #[serde(default)]
    layers: Vec<String>,
}

pub(crate) fn unpack(files: &Files, staging: &Path, progress: &dyn Progress) -> Result<Unpacked> {
    let images: Vec<Image> = files.read_json("manifest.json", None)?;
    // A save of several images lists each; the first is the one asked for.
    let image = images
        .into_iter()
        .next()
        .ok_or_else(|| files.bad("manifest.json lists no images"))?;
    let config = image::read_config(files, &image.config, digest_in_name(&image.config).as_ref())?;
    let blobs: Vec<LayerBlob> = image
        .layers
        .iter()
        .map(|name| LayerBlob {
            name: name.clone(),
            digest: digest_in_name(name),
            size: None,
        })
        .collect();
    let layers = image::unpack_layers(files, &blobs, &config.diff_ids, staging, progress)?;
    Ok(Unpacked {
        layers,
        config: config.run,
    })
}

/// The digest a file name promises: `blobs/sha256/<hex>`, or `<hex>.json` for
/// a legacy config.
fn digest_in_name(name: &str) -> Option<Digest> {
    let name = name.trim_start_matches("./");
    let hex = name
        .strip_prefix("blobs/sha256/")
        .or_else(|| name.strip_suffix(".json"))?;
    Digest::parse(&format!("sha256:{hex}")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_read_from_content_addressed_names() {
        let hex = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let empty = Some(Digest::of(b""));
        assert_eq!(digest_in_name(&format!("blobs/sha256/{hex}")), empty);
        assert_eq!(digest_in_name(&format!("{hex}.json")), empty);
        assert_eq!(digest_in_name(&format!("{hex}/layer.tar")), None);
        assert_eq!(digest_in_name("config.json"), None);
    }
}
