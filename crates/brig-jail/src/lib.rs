//! How the Linux kernel enforces a brig sandbox.
//!
//! One module per kernel concern. Every `unsafe` block of brig lives in this crate,
//! each with a SAFETY comment.

pub mod cgroup;
mod error;
pub mod seccomp;

pub use error::{Context, JailError};
