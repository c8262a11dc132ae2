//! TLS for `https://` and `wss://` nodes: which certificate authorities are trusted
//! ([`TlsConfig`]) and the stream both the WebSocket handshake and the HTTP API run over
//! ([`MaybeTls`]), so the two speak TLS through one connector.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::error::{Error, Result};

/// The certificate authorities a client trusts for TLS nodes. Cheap to clone.
#[derive(Clone)]
pub struct TlsConfig {
    config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsConfig")
    }
}

impl TlsConfig {
    /// The system's root certificates (the platform store, e.g. `/etc/ssl/certs`). Loaded once
    /// per process: reading the store takes milliseconds and every connection would repeat it.
    pub fn system() -> Result<TlsConfig> {
        static SYSTEM: OnceLock<std::result::Result<TlsConfig, String>> = OnceLock::new();
        SYSTEM
            .get_or_init(|| {
                let found = rustls_native_certs::load_native_certs();
                let mut roots = rustls::RootCertStore::empty();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    let why = found.errors.first().map(|e| format!(" ({e})")).unwrap_or_default();
                    return Err(format!("no system root certificates found{why}: name the node's CA (--ca FILE)"));
                }
                build(roots).map_err(|e| e.to_string())
            })
            .clone()
            .map_err(Error::Tls)
    }

    /// Trusts only the certificate authorities in the PEM file `path` (e.g. a private or test
    /// CA), not the system's.
    pub fn with_ca_file(path: &Path) -> Result<TlsConfig> {
        let shown = path.display();
        let certs = CertificateDer::pem_file_iter(path).map_err(|e| Error::Tls(format!("CA file {shown}: {e}")))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in certs {
            let cert = cert.map_err(|e| Error::Tls(format!("CA file {shown}: {e}")))?;
            roots.add(cert).map_err(|e| Error::Tls(format!("CA file {shown}: {e}")))?;
        }
        if roots.is_empty() {
            return Err(Error::Tls(format!("CA file {shown} holds no PEM certificate")));
        }
        build(roots)
    }

    /// Runs the TLS handshake over `tcp`, verifying the certificate against `host`.
    pub async fn connect(&self, host: &str, tcp: TcpStream) -> Result<MaybeTls> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| Error::Tls(format!("{host:?} is not a TLS server name")))?;
        let tls = TlsConnector::from(self.config.clone()).connect(name, tcp).await.map_err(|e| tls_error(host, e))?;
        Ok(MaybeTls::Tls(Box::new(tls)))
    }
}

fn build(roots: rustls::RootCertStore) -> Result<TlsConfig> {
    // The ring provider, as the node's own TLS: the build carries one crypto library.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConfig { config: Arc::new(config) })
}

/// A failed handshake; a certificate that did not verify is told apart.
fn tls_error(host: &str, e: io::Error) -> Error {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        // rustls passes this verifier's error on as `Other`, known only by its name.
        Some(rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)))
            if format!("{other:?}").contains("CaUsedAsEndEntity") =>
        {
            Error::CaCertificate { host: host.to_string() }
        }
        Some(cert @ rustls::Error::InvalidCertificate(_)) => {
            Error::UntrustedCertificate { host: host.to_string(), detail: cert.to_string() }
        }
        _ => Error::Tls(format!("TLS handshake with {host}: {e}")),
    }
}

/// A connection to a node: plain TCP, or TLS over TCP. The WebSocket handshake and the HTTP
/// API both run over it.
pub enum MaybeTls {
    Plain(TcpStream),
    // Boxed: the TLS state is ~1 KiB, the plain stream a few words, and the bench holds tens
    // of thousands of plain connections.
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for MaybeTls {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for MaybeTls {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(s) => s.is_write_vectored(),
            MaybeTls::Tls(s) => s.is_write_vectored(),
        }
    }
}
