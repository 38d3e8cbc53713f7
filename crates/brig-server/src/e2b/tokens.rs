//! The access tokens of E2B sandboxes: `envdAccessToken` (sent back as
//! `X-Access-Token`) and `trafficAccessToken` (`E2B-Traffic-Access-Token`).
//!
//! They are derived, not stored: HMAC-SHA256 of the sandbox's id under a key of the
//! daemon's own (`<data-dir>/e2b.key`, 0600, made at first start). A token so stays
//! valid across restarts, as sandboxes do, with no column to keep and nothing to
//! leak from the catalog; and the two kinds differ by a label, so one is never the
//! other.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const KEY_FILE: &str = "e2b.key";
const KEY_BYTES: usize = 32;

/// The daemon's token key.
#[derive(Clone)]
pub struct TokenKey(Arc<[u8; KEY_BYTES]>);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

/// What a token lets its holder reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// envd (port 49983) and every other port.
    Envd,
    /// The sandbox's ports other than envd's.
    Traffic,
}

impl Kind {
    fn label(self) -> &'static [u8] {
        match self {
            Kind::Envd => b"e2b-envd-access\0",
            Kind::Traffic => b"e2b-traffic-access\0",
        }
    }
}

impl TokenKey {
    /// The key of the daemon whose data dir is `data_dir`, made (0600) if missing.
    pub fn load_or_create(data_dir: &Path) -> anyhow::Result<TokenKey> {
        let path = data_dir.join(KEY_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let key: [u8; KEY_BYTES] = bytes.as_slice().try_into().map_err(|_| {
                    anyhow::anyhow!("{} is not a {KEY_BYTES}-byte key", path.display())
                })?;
                return Ok(TokenKey(Arc::new(key)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
        let key: [u8; KEY_BYTES] = rand::random();
        // create_new: two daemons racing on one data dir must not each believe
        // their own key; the loser reads the winner's.
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut file) => {
                file.write_all(&key)
                    .and_then(|()| file.sync_all())
                    .with_context(|| format!("cannot write {}", path.display()))?;
                Ok(TokenKey(Arc::new(key)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Self::load_or_create(data_dir)
            }
            Err(e) => Err(e).with_context(|| format!("cannot create {}", path.display())),
        }
    }

    /// A key of this process only, for a daemon that cannot keep one: its tokens
    /// end with it.
    pub fn ephemeral() -> TokenKey {
        TokenKey(Arc::new(rand::random()))
    }

    fn mac(&self, kind: Kind, sandbox_id: &str) -> Hmac<Sha256> {
        // new_from_slice fails only for key lengths HMAC cannot take: none.
        let mut mac = Hmac::<Sha256>::new_from_slice(self.0.as_slice())
            .expect("HMAC takes keys of any length");
        mac.update(kind.label());
        mac.update(sandbox_id.as_bytes());
        mac
    }

    /// The token of `kind` for sandbox `sandbox_id`.
    pub fn token(&self, kind: Kind, sandbox_id: &str) -> String {
        hex::encode(self.mac(kind, sandbox_id).finalize().into_bytes())
    }

    /// Whether `presented` is the token of `kind` for `sandbox_id` (in constant time).
    pub fn verify(&self, kind: Kind, sandbox_id: &str, presented: &str) -> bool {
        let Ok(bytes) = hex::decode(presented.trim()) else {
            return false;
        };
        self.mac(kind, sandbox_id).verify_slice(&bytes).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_per_sandbox_per_kind_and_survive_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let key = TokenKey::load_or_create(dir.path()).unwrap();
        let envd = key.token(Kind::Envd, "sbx1");
        assert!(key.verify(Kind::Envd, "sbx1", &envd));
        assert!(!key.verify(Kind::Traffic, "sbx1", &envd));
        assert!(!key.verify(Kind::Envd, "sbx2", &envd));
        assert!(!key.verify(Kind::Envd, "sbx1", "not hex"));
        assert!(!key.verify(Kind::Envd, "sbx1", ""));
        let again = TokenKey::load_or_create(dir.path()).unwrap();
        assert_eq!(again.token(Kind::Envd, "sbx1"), envd);
        let mode = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        let other = TokenKey::load_or_create(tempfile::tempdir().unwrap().path()).unwrap();
        assert!(!other.verify(Kind::Envd, "sbx1", &envd));
    }
}
