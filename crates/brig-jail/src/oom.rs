//! Which process the kernel kills when a sandbox's memory runs out.
//!
//! The OOM killer takes the process with the most memory, and init (a copy of brig)
//! often is that: a command filling /tmp (a tmpfs charged to the sandbox's memory)
//! holds next to nothing itself. Init's end is the session's: a reviewer's
//! `head -c 600M /dev/zero > /tmp/z` in a default session (memory and disk 512M)
//! ended the whole session, with the exec answered 409, instead of the command
//! being killed. So every command starts with the highest score (1000): it goes
//! first, in the sandbox and on the host.
//!
//! Init cannot lower its own score (that needs CAP_SYS_RESOURCE, which root may lack
//! and init has dropped), but any process may move between the lowest score it was
//! given and 1000. So init raises its own score just before starting a command
//! (which inherits it) and goes back right after, through a descriptor opened before
//! Landlock, which refuses writes to /proc. Init holds the command's score only from
//! the clone until the command has exec'd and init runs again: microseconds, in
//! which an OOM kill could take init as before.

use std::io::{Read, Write};

/// The highest score: killed first.
const COMMAND_SCORE: &[u8] = b"1000";

/// Init's `/proc/self/oom_score_adj`, open for writing, and its own score.
pub(crate) struct OomScore {
    file: std::fs::File,
    own: Vec<u8>,
}

impl OomScore {
    /// Opens init's score file; `None` where /proc does not have it (then commands
    /// keep init's score).
    pub(crate) fn open() -> Option<OomScore> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/proc/self/oom_score_adj")
            .ok()?;
        let mut own = Vec::new();
        file.read_to_end(&mut own).ok()?;
        let own = own.trim_ascii().to_vec();
        Some(OomScore { file, own })
    }

    /// Runs `spawn` (a clone of a command, which inherits the score) with init's
    /// score raised to the command's, then puts init's back.
    pub(crate) fn for_command<T>(&mut self, spawn: impl FnOnce() -> T) -> T {
        // The file ignores offsets: every write sets the score.
        let raised = self.file.write(COMMAND_SCORE).is_ok();
        let spawned = spawn();
        if raised {
            let _ = self.file.write(&self.own);
        }
        spawned
    }
}
