//! TLS interception, for a secret's hosts only: the sandbox's TLS ends at brig
//! (a certificate from [`crate::ca::Ca`]), the request head is read, checked and
//! given the secrets' values, and goes on over brig's own TLS to the upstream,
//! whose certificate is verified against the web's roots (plus the operator's).
//! One request per connection (`Connection: close` upstream), HTTP/1.1 only.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::ClientConfig;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::relay::{close_gently, splice, Pending};
use crate::Shared;

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// How brig checks the upstreams of intercepted connections.
pub(crate) fn client_config(extra: &[CertificateDer<'static>]) -> Result<ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for cert in extra {
        roots
            .add(cert.clone())
            .map_err(|e| format!("an extra upstream CA is not usable: {e}"))?;
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A stream whose first bytes were already read (the ClientHello brig looked at).
pub(crate) struct Prefixed<'a, S> {
    prefix: Vec<u8>,
    at: usize,
    inner: &'a mut S,
}

impl<'a, S> Prefixed<'a, S> {
    pub fn new(prefix: Vec<u8>, inner: &'a mut S) -> Self {
        Prefixed {
            prefix,
            at: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<'_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.at);
            buf.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut *this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Whether TLS to `name` is intercepted: a secret may go there and there is a CA.
pub(crate) fn intercepts(shared: &Shared, name: &str) -> bool {
    shared.tls.is_some() && shared.secrets.iter().any(|s| s.covers(name))
}

/// Serves one intercepted connection; `hello` is the ClientHello already read.
pub(crate) async fn intercept<C>(
    shared: &Shared,
    event: Pending,
    client: &mut C,
    hello: Vec<u8>,
    upstream: TcpStream,
    name: &str,
) where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let Some(tls) = &shared.tls else {
        return event.refused(shared, "internal");
    };
    // One certificate per name as rules compare names (`API.test.` is `api.test`).
    let Ok(name) = brig_policy::net::normalize_name(name) else {
        return event.refused(shared, "not_allowed");
    };
    let name = name.as_str();
    let config = match tls.ca.server_config(name) {
        Ok(config) => config,
        Err(e) => {
            tracing::warn!("egress: no certificate for {name}: {e}");
            return event.refused(shared, "internal");
        }
    };
    let accept = tokio_rustls::TlsAcceptor::from(config).accept(Prefixed::new(hello, client));
    let mut client = match tokio::time::timeout(shared.limits.handshake, accept).await {
        Ok(Ok(stream)) => stream,
        // The sandbox's TLS did not accept brig's certificate (no CA bundle?), or garbage.
        Ok(Err(_)) | Err(_) => return event.refused(shared, "client_tls_failed"),
    };
    let read = tokio::time::timeout(shared.limits.handshake, crate::http::read_head(&mut client));
    let (buf, head_len) = match read.await {
        Ok(Ok(read)) => read,
        Ok(Err(_)) | Err(_) => return event.refused(shared, "protocol_error"),
    };
    let (head, body) = buf.split_at(head_len);
    let request = match crate::http::origin_request(shared, name, head, body) {
        Ok(request) => request,
        Err(refusal) => {
            let _ = client.write_all(&refusal.response).await;
            event.refused_for(shared, refusal.code, refusal.secret);
            return close_gently(client).await;
        }
    };
    let server = ServerName::try_from(name.to_string());
    let connect = async {
        let server = server.map_err(|e| e.to_string())?;
        tokio_rustls::TlsConnector::from(tls.upstream.clone())
            .connect(server, upstream)
            .await
            .map_err(|e| e.to_string())
    };
    let failed = match tokio::time::timeout(shared.limits.connect, connect).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(why)) => Err(why),
        Err(_) => Err("timed out".to_string()),
    };
    let mut upstream = match failed {
        Ok(stream) => stream,
        Err(why) => {
            let message =
                format!("brig egress: {name} is allowed, but its TLS could not be verified: {why}");
            let response = crate::http::response(502, "Bad Gateway", &message);
            let _ = client.write_all(&response).await;
            event.refused(shared, "upstream_tls_failed");
            return close_gently(client).await;
        }
    };
    if upstream.write_all(&request).await.is_err() {
        return event.refused(shared, "unreachable");
    }
    let mut event = event;
    event.sent_up = request.len() as u64;
    splice(shared, event, &mut client, upstream).await;
}
