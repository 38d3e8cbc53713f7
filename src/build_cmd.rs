//! `brig image build`: recipes arrive in the next commit.

use std::path::Path;

use brig_image::store::{ImageRecord, Store};
use brig_image::{ImageError, Progress};

pub fn build(
    _store: &Store,
    _name: &str,
    recipe: &Path,
    _replace: bool,
    _progress: &dyn Progress,
) -> Result<ImageRecord, ImageError> {
    Err(ImageError::Unsupported(format!(
        "cannot build {}: recipes are not supported by this build yet",
        recipe.display()
    )))
}
