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

/// What the caller chose over an image's own defaults (see [`ImageConfig::apply`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chosen {
    /// Numeric `(uid, gid)`; `None` runs as the image's user.
    pub user: Option<(u32, u32)>,
    /// The working directory; `None` starts in the image's.
    pub cwd: Option<String>,
}

impl ImageConfig {
    /// Makes `spec` start from this image, whose `layers` (bottom first, held in
    /// use by the caller) become its root. The image's environment goes under what
    /// `spec.env` already holds (the caller's wins, whenever it was set); its
    /// working directory and user apply where `chosen` names none, and an image
    /// that names no user runs as root, as OCI runtimes run it. The one
    /// composition of an image with a policy: `brig run`, recipe builds and the
    /// daemon's sessions all start images through it.
    ///
    /// An environment entry without `=` is left out: an imported image's config is
    /// not the caller's input to refuse.
    pub fn apply(
        &self,
        spec: &mut brig_policy::SandboxSpec,
        layers: &[PathBuf],
        chosen: &Chosen,
    ) -> Result<(), String> {
        spec.filesystem.root = brig_policy::RootSource::Layers(layers.to_vec());
        for entry in &self.env {
            if let Some((key, value)) = entry.split_once('=') {
                spec.env
                    .entry(key.to_string())
                    .or_insert_with(|| value.to_string());
            }
        }
        if let Some(cwd) = chosen.cwd.as_ref().or(self.workdir.as_ref()) {
            spec.cwd.clone_from(cwd);
        }
        let (uid, gid) = match (chosen.user, &self.user) {
            (Some(ids), _) => ids,
            (None, Some(user)) => resolve_user(user, layers).map_err(|e| format!("image {e}"))?,
            (None, None) => (0, 0),
        };
        spec.identity.uid = uid;
        spec.identity.gid = gid;
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> ImageConfig {
        ImageConfig {
            env: vec!["PATH=/opt/bin".into(), "LANG=C".into(), "broken".into()],
            user: Some("app".into()),
            workdir: Some("/srv".into()),
            ..ImageConfig::default()
        }
    }

    fn layer_with_passwd() -> tempfile::TempDir {
        let layer = tempfile::tempdir().unwrap();
        std::fs::create_dir(layer.path().join("etc")).unwrap();
        std::fs::write(
            layer.path().join("etc/passwd"),
            "app:x:500:600::/:/bin/sh\n",
        )
        .unwrap();
        layer
    }

    #[test]
    fn an_image_fills_what_the_caller_left_open() {
        let layer = layer_with_passwd();
        let layers = vec![layer.path().to_path_buf()];
        let mut spec = brig_policy::SandboxSpec::new(vec!["true".into()]);
        spec.env.insert("LANG".into(), "en_US.UTF-8".into());
        image()
            .apply(&mut spec, &layers, &Chosen::default())
            .unwrap();
        assert_eq!(
            spec.filesystem.root,
            brig_policy::RootSource::Layers(layers)
        );
        assert_eq!(spec.env["PATH"], "/opt/bin");
        assert_eq!(spec.env["LANG"], "en_US.UTF-8", "the caller's env wins");
        assert!(!spec.env.contains_key("broken"));
        assert_eq!(spec.cwd, "/srv");
        assert_eq!((spec.identity.uid, spec.identity.gid), (500, 600));
    }

    #[test]
    fn the_callers_choices_win_and_no_user_means_root() {
        let layer = layer_with_passwd();
        let layers = vec![layer.path().to_path_buf()];
        let chosen = Chosen {
            user: Some((7, 8)),
            cwd: Some("/tmp".into()),
        };
        let mut spec = brig_policy::SandboxSpec::new(vec!["true".into()]);
        image().apply(&mut spec, &layers, &chosen).unwrap();
        assert_eq!(spec.cwd, "/tmp");
        assert_eq!((spec.identity.uid, spec.identity.gid), (7, 8));

        let mut spec = brig_policy::SandboxSpec::new(vec!["true".into()]);
        ImageConfig::default()
            .apply(&mut spec, &layers, &Chosen::default())
            .unwrap();
        assert_eq!((spec.identity.uid, spec.identity.gid), (0, 0));
        assert_eq!(spec.cwd, brig_policy::defaults::WORKSPACE);

        let missing = ImageConfig {
            user: Some("nobody-here".into()),
            ..ImageConfig::default()
        };
        let mut spec = brig_policy::SandboxSpec::new(vec!["true".into()]);
        let err = missing.apply(&mut spec, &layers, &Chosen::default());
        assert!(err.unwrap_err().contains("nobody-here"));
    }
}
