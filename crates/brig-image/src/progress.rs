//! Progress reporting for long work; the CLI draws bars, tests ignore it.

/// Receives progress of one long task. `total` is `None` when unknown.
pub trait Progress: Sync {
    /// A new phase starts ("unpack layer 2/5", "pack", "verify").
    fn phase(&self, _name: &str, _total_bytes: Option<u64>) {}
    /// `bytes` more were processed in the current phase.
    fn advance(&self, _bytes: u64) {}
    /// Checked between units of work; returning true aborts with `ImageError::Interrupted`.
    fn cancelled(&self) -> bool {
        false
    }
}

/// Reports nothing.
pub struct Silent;

impl Progress for Silent {}
