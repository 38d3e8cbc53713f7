//! Messages from the sandbox's init to the brig process that started it, one JSON
//! object per line on a pipe. Writes are below PIPE_BUF in practice and each is one
//! write(2), so the command's exec-failure message and init's own never interleave.

use serde::{Deserialize, Serialize};

use crate::caps::CapsReport;
use crate::landlock::LandlockReport;
use crate::report::NamespaceIds;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ChildMessage {
    /// Setup is complete; the command is about to start.
    Ready {
        caps: CapsReport,
        landlock: LandlockReport,
        seccomp_installed: bool,
        namespaces: NamespaceIds,
        timings_us: Vec<crate::report::Timing>,
    },
    /// Setup failed; nothing of the command ran.
    Failed { code: String, message: String },
    /// execve of the command failed (sent by the command's process).
    ExecFailed { message: String, exit_code: i32 },
    /// The command ended; everything else in the sandbox is being killed.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        /// CPU time init itself used (setup included), so the parent can tell the
        /// command's share from its own rusage of the whole tree.
        #[serde(default)]
        init_cpu_us: u64,
    },
}

impl ChildMessage {
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_else(|_| b"{\"type\":\"failed\",\"code\":\"internal\",\"message\":\"unserializable message\"}".to_vec());
        line.push(b'\n');
        line
    }
}

/// Splits complete lines off `buffer` and parses them.
pub fn drain_messages(buffer: &mut Vec<u8>) -> Vec<ChildMessage> {
    let mut out = Vec::new();
    while let Some(pos) = buffer.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = buffer.drain(..=pos).collect();
        if let Ok(msg) = serde_json::from_slice(&line[..line.len() - 1]) {
            out.push(msg);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_partial_lines() {
        let a = ChildMessage::Exited {
            code: Some(3),
            signal: None,
            init_cpu_us: 1200,
        };
        let b = ChildMessage::ExecFailed {
            message: "x: not found".into(),
            exit_code: 127,
        };
        let mut buffer = a.to_line();
        let second = b.to_line();
        buffer.extend_from_slice(&second[..5]);
        assert_eq!(drain_messages(&mut buffer), vec![a]);
        buffer.extend_from_slice(&second[5..]);
        assert_eq!(drain_messages(&mut buffer), vec![b]);
        assert!(buffer.is_empty());
    }
}
