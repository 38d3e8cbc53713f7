//! The session types other verbs share: a volume's capacity (`Size`), a snapshot's
//! mounts (`BundleMount`), an onyx execute's files (`FileRef`) and what a caller sees
//! of a session (`SessionInfo`, also a restore's answer). Their wire forms, with the
//! OpenAPI schemas, are brig-server's (`rest::sessions`).

use std::collections::BTreeMap;

use brig_policy::parse_size;
use serde::{Deserialize, Serialize};

use crate::fault::Error as ApiError;

/// A size as a string with a unit (`"512M"`) or a number of bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    pub fn bytes(&self) -> Result<u64, ApiError> {
        match self {
            Size::Bytes(n) => Ok(*n),
            Size::Text(t) => parse_size(t).map_err(|e| ApiError::invalid(e.to_string())),
        }
    }
}

/// A file uploaded through `/v1/files`, placed into the session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRef {
    /// Relative to the working directory (/workspace); no `..`.
    pub path: String,
    pub file_id: String,
}

/// An uploaded tar bundle mounted read-only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleMount {
    pub file_id: String,
    /// Absolute path inside the sandbox.
    pub path: String,
}

// What a caller sees of a live session (no doc comment: it would be the schema's
// description, which has none).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionInfo {
    pub session_id: String,
    /// "running" or "paused".
    pub state: String,
    pub image: Option<String>,
    pub snapshot: Option<String>,
    pub created_at: String,
    pub expires_at: Option<String>,
    pub idle_timeout_seconds: Option<u64>,
    pub last_active_at: String,
    /// Whether the sandbox came ready-made from the warm pool.
    pub pooled: bool,
    /// Bundles bound read-only.
    pub mounts: Vec<BundleMount>,
    /// The volume mounted at `/volume`.
    pub volume: Option<String>,
    /// The caller's labels (given at create, replaced by `PATCH`).
    pub metadata: BTreeMap<String, String>,
    /// Where it may connect (mode `none` for a session without a way out).
    pub network: crate::egress::Network,
    /// Its secrets: names, hosts and placeholders, never values.
    #[serde(default)]
    pub secrets: Vec<crate::secrets::SecretInfo>,
    pub limits: serde_json::Value,
    /// What isolation the sandbox really has (as `brig run --json`'s `enforced`).
    pub enforced: serde_json::Value,
}
