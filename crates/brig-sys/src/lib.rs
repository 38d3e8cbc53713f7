//! The kernel calls brig's enforcement layer (`brig-jail`) and its image store
//! (`brig-image`) both need: resolving names beneath a directory (`openat2`),
//! writing sparse files, read-only loop devices, tying a helper's life to brig's.
//! Here so that images need not depend on the crate that builds sandboxes; with
//! `brig-jail`, the only crate where `unsafe` is allowed, each block explained.

pub mod layered;
pub mod loopdev;
pub mod process;
pub mod resolve;
pub mod sparse;
