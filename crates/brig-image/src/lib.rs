//! brig images: read-only root filesystems made of stacked layers.
//!
//! | module | concern |
//! |---|---|
//! | `unpack` | sources (directory, tar, OCI layout, docker save) to staged layer trees |
//! | `tree` | the canonical content digest of a layer tree; merged views and diffs |
//! | `store` | the on-disk store: layers by digest, images by name, atomic commits, gc |
//! | `pack` | a staged tree to one EROFS layer file |
//! | `mount` | mounting each layer once per host, shared by every sandbox |
//!
//! The store layout and the digest are documented in docs/IMAGES.md.

mod config;
mod error;
mod progress;
pub mod tree;
pub mod unpack;

pub use config::{resolve_user, Chosen, ImageConfig};
pub use error::{ImageError, IoContext, Result};
pub use progress::{Progress, Silent};
pub mod mount;
pub mod ops;
pub mod pack;
pub mod recipe;
pub mod store;
