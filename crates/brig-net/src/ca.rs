//! The certificate authority of TLS interception: brig answers a sandbox's TLS to
//! a secret's host with a certificate for that host it issues itself, which the
//! sandbox trusts through the CA bundle brig gives it. A daemon keeps one CA in a
//! 0600 file ([`Ca::load_or_create`]); `brig run` makes one per run ([`Ca::ephemeral`]).
//! Leaf certificates are made once per host and kept.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::ServerConfig;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// A DER certificate (an extra upstream root).
pub type CertificateDer = rustls_pki_types::CertificateDer<'static>;

/// Leaf configurations kept before the cache starts over.
const MAX_LEAVES: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("egress CA {path}: {reason}")]
    File { path: String, reason: String },
    #[error("egress CA: {0}")]
    Make(String),
}

pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer,
    cert_pem: String,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("key", &"<redacted>").finish()
    }
}

/// The CA's own parameters: rebuilt identically when its file is loaded, so the
/// leaves it issues name the certificate the sandbox trusts.
fn params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "brig egress CA");
    name.push(DnType::OrganizationName, "brig");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn make(e: rcgen::Error) -> CaError {
    CaError::Make(e.to_string())
}

impl Ca {
    /// A new CA that lives in memory only (one `brig run`).
    pub fn ephemeral() -> Result<Ca, CaError> {
        let key = KeyPair::generate().map_err(make)?;
        let cert = params().self_signed(&key).map_err(make)?;
        Ok(Ca::from_parts(key, cert.der().clone(), cert.pem()))
    }

    fn from_parts(key: KeyPair, cert: CertificateDer, cert_pem: String) -> Ca {
        Ca {
            issuer: Issuer::new(params(), key),
            cert,
            cert_pem,
            leaves: Mutex::new(HashMap::new()),
        }
    }

    /// The CA kept in `path` (key and certificate, PEM), made there (mode 0600) if
    /// the file does not exist. An existing file must be the caller's and readable
    /// by nobody else.
    pub fn load_or_create(path: &Path) -> Result<Ca, CaError> {
        let fail = |reason: String| CaError::File {
            path: path.display().to_string(),
            reason,
        };
        match std::fs::symlink_metadata(path) {
            Ok(meta) => {
                if !meta.is_file() {
                    return Err(fail("not a regular file".into()));
                }
                if meta.mode() & 0o077 != 0 || meta.uid() != nix::unistd::geteuid().as_raw() {
                    return Err(fail(
                        "must belong to brig's user with mode 0600: it holds the CA's key".into(),
                    ));
                }
                let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
                let split = text
                    .find("-----BEGIN CERTIFICATE-----")
                    .ok_or_else(|| fail("no certificate in it".into()))?;
                let key =
                    KeyPair::from_pem(&text[..split]).map_err(|e| fail(format!("bad key: {e}")))?;
                let cert_pem = text[split..].to_string();
                let cert = pem_certificates(&cert_pem)
                    .map_err(fail)?
                    .into_iter()
                    .next()
                    .ok_or_else(|| fail("no certificate in it".into()))?;
                Ok(Ca::from_parts(key, cert, cert_pem))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let ca = Ca::ephemeral()?;
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(|e| fail(e.to_string()))?;
                let text = format!("{}{}", ca.issuer.key().serialize_pem(), ca.cert_pem);
                file.write_all(text.as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(|e| fail(e.to_string()))?;
                Ok(ca)
            }
            Err(e) => Err(fail(e.to_string())),
        }
    }

    /// The CA's certificate, PEM: what the sandbox trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_der(&self) -> &CertificateDer {
        &self.cert
    }

    /// A TLS server configuration presenting a certificate for `host` (made once).
    pub(crate) fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, CaError> {
        if let Some(config) = self.leaves.lock().expect("leaf cache").get(host) {
            return Ok(config.clone());
        }
        let key = KeyPair::generate().map_err(make)?;
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(make)?;
        params
            .distinguished_name
            .push(DnType::CommonName, host.to_string());
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let leaf = params.signed_by(&key, &self.issuer).map_err(make)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(crate::mitm::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| CaError::Make(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), self.cert.clone()], key_der)
            .map_err(|e| CaError::Make(e.to_string()))?;
        // One request per connection, read as HTTP/1.1: no h2.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut leaves = self.leaves.lock().expect("leaf cache");
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_string(), config.clone());
        Ok(config)
    }
}

/// The certificates in PEM `text`.
pub fn pem_certificates(text: &str) -> Result<Vec<CertificateDer>, String> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("bad PEM: {e}"))
}

/// The certificates in the PEM file at `path` (an operator's extra upstream roots).
pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer>, CaError> {
    let fail = |reason: String| CaError::File {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let certs = pem_certificates(&text).map_err(fail)?;
    if certs.is_empty() {
        return Err(fail("no certificate in it".into()));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_ca_is_kept_private_and_reloads_as_itself() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        let made = Ca::load_or_create(&path).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        let loaded = Ca::load_or_create(&path).unwrap();
        assert_eq!(made.cert_pem(), loaded.cert_pem());
        assert!(!format!("{loaded:?}").contains("PRIVATE"));
        // A leaf from the reloaded CA verifies against the stored certificate.
        verify_leaf(&loaded, made.cert_der(), "api.test");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let err = Ca::load_or_create(&path).unwrap_err().to_string();
        assert!(err.contains("0600"), "{err}");
    }

    #[test]
    fn leaves_are_cached_per_host_and_chain_to_the_ca() {
        let ca = Ca::ephemeral().unwrap();
        let a = ca.server_config("a.test").unwrap();
        let again = ca.server_config("a.test").unwrap();
        assert!(Arc::ptr_eq(&a, &again));
        let b = ca.server_config("b.test").unwrap();
        assert!(!Arc::ptr_eq(&a, &b));
        verify_leaf(&ca, ca.cert_der(), "b.test");
        assert!(load_certificates(Path::new("/nonexistent")).is_err());
    }

    /// A TLS handshake in memory: a client trusting only `root` accepts `ca`'s leaf.
    fn verify_leaf(ca: &Ca, root: &CertificateDer, host: &str) {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(root.clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(crate::mitm::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls_pki_types::ServerName::try_from(host.to_string()).unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
        let mut server = rustls::ServerConnection::new(ca.server_config(host).unwrap()).unwrap();
        for _ in 0..10 {
            let mut buf = Vec::new();
            client.write_tls(&mut buf).unwrap();
            server.read_tls(&mut &buf[..]).unwrap();
            server.process_new_packets().unwrap();
            let mut buf = Vec::new();
            server.write_tls(&mut buf).unwrap();
            client.read_tls(&mut &buf[..]).unwrap();
            client.process_new_packets().unwrap();
            if !client.is_handshaking() && !server.is_handshaking() {
                return;
            }
        }
        panic!("handshake did not finish");
    }
}
