//! What an image says about how to run it (from an OCI/docker config or a recipe).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The run defaults an image carries. Every field is optional: a sandbox started
/// from the image uses them unless the caller overrides them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageConfig {
    /// `KEY=VALUE` entries, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// `UID`, `UID:GID` or a name, as the OCI config's `User` field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Absolute working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
}

/// An image's `User` (`UID`, `NAME`, `UID:GID`, `NAME:GROUP`) as numeric ids: names
/// are looked up in the image's own /etc/passwd and /etc/group, as its stacked
/// `layers` (bottom first) show them. A lone user takes its passwd entry's group
/// (or, when numeric, the same number). The error says which name is missing.
pub fn resolve_user(user: &str, layers: &[PathBuf]) -> Result<(u32, u32), String> {
    let (user_part, group_part) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let lookup = |db: &str, name: &str, field: usize| -> Result<u32, String> {
        if let Ok(id) = name.parse::<u32>() {
            return Ok(id);
        }
        let text = brig_sys::layered::read_layered(layers, db).unwrap_or_default();
        text.lines()
            .map(|line| line.split(':').collect::<Vec<_>>())
            .find(|fields| fields.first() == Some(&name))
            .and_then(|fields| fields.get(field).and_then(|id| id.parse().ok()))
            .ok_or_else(|| format!("user '{name}' is not in the image's /{db}"))
    };
    let uid = lookup("etc/passwd", user_part, 2)?;
    let gid = match group_part {
        Some(group) => lookup("etc/group", group, 2)?,
        None if user_part.parse::<u32>().is_ok() => uid,
        None => lookup("etc/passwd", user_part, 3)?,
    };
    Ok((uid, gid))
}
