//! TLS for deployments without a proxy (`--tls-cert` / `--tls-key`, rustls).
//!
//! The handshake and the HTTP exchange run through `tokio-rustls`. A WebSocket connection then
//! takes the rustls session out of it and drives it directly as a [`TlsWire`]: the outbox
//! writes with non-blocking `try_write` calls from whichever task fans a publication out
//! (see `outbox.rs`), which an `AsyncWrite` stream cannot offer.
//!
//! [`TlsWire::try_write`] accepts plaintext only once earlier records are on the socket, so
//! the bytes rustls holds stay bounded by one chunk; records it could not write at once are
//! left for the connection task, which [`TlsWire::notified`] wakes to wait for writability
//! and [`TlsWire::flush`] them.

use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ServerConfig, ServerConnection};
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::error::ConfigError;
use crate::outbox::Wire;

/// `[tls]` in the configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
}

/// Loads the certificate and key; `None` when TLS is not configured.
pub fn load(c: &TlsConfig) -> Result<Option<Arc<ServerConfig>>, ConfigError> {
    let (cert, key) = match (&c.cert, &c.key) {
        (None, None) => return Ok(None),
        (Some(cert), Some(key)) => (cert, key),
        (Some(_), None) => return Err(ConfigError("tls.key: --tls-cert needs --tls-key".into())),
        (None, Some(_)) => return Err(ConfigError("tls.cert: --tls-key needs --tls-cert".into())),
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ConfigError(format!("tls.cert: {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(ConfigError(format!("tls.cert: {}: no certificate in the file", cert.display())));
    }
    // The key's error never quotes the file's content.
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|_| ConfigError(format!("tls.key: {}: no readable PEM private key", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError(format!("tls: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, private)
        .map_err(|e| ConfigError(format!("tls.key: {}: does not fit the certificate: {e}", key.display())))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(Arc::new(config)))
}

/// `io::Read` / `io::Write` over a non-blocking `TcpStream` (`WouldBlock` when not ready).
struct Sock<'a>(&'a TcpStream);

impl Read for Sock<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for Sock<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct TlsState {
    conn: ServerConnection,
    /// Decrypted bytes waiting in rustls.
    buffered: usize,
    /// The peer sent close_notify.
    closed: bool,
}

/// One WebSocket connection's TLS session over its TCP socket.
pub struct TlsWire {
    tcp: TcpStream,
    state: Mutex<TlsState>,
    wake: Notify,
}

fn flush_locked(conn: &mut ServerConnection, tcp: &TcpStream) -> io::Result<()> {
    while conn.wants_write() {
        if conn.write_tls(&mut Sock(tcp))? == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

impl TlsWire {
    /// Takes over a session after the HTTP upgrade.
    pub fn new(tcp: TcpStream, conn: ServerConnection) -> TlsWire {
        // Plaintext that tokio-rustls decrypted but hyper never read is still in the session.
        let mut conn = conn;
        let buffered = conn.process_new_packets().map(|s| s.plaintext_bytes_to_read()).unwrap_or(0);
        TlsWire { tcp, state: Mutex::new(TlsState { conn, buffered, closed: false }), wake: Notify::new() }
    }

    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Reads decrypted bytes: `WouldBlock` when none are ready, `Ok(0)` at the end.
    pub fn read_plain(&self, out: &mut [u8]) -> io::Result<usize> {
        let mut st = self.state.lock();
        loop {
            if st.buffered > 0 {
                let n = st.conn.reader().read(out)?;
                st.buffered = st.buffered.saturating_sub(n);
                if n > 0 {
                    return Ok(n);
                }
                st.buffered = 0;
            }
            if st.closed {
                return Ok(0);
            }
            if st.conn.read_tls(&mut Sock(&self.tcp))? == 0 {
                return Ok(0);
            }
            let io = match st.conn.process_new_packets() {
                Ok(io) => io,
                Err(e) => {
                    // rustls queued an alert for the peer; send it if the socket takes it.
                    let _ = flush_locked(&mut st.conn, &self.tcp);
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
            };
            st.buffered = io.plaintext_bytes_to_read();
            st.closed = io.peer_has_closed();
            if st.conn.wants_write() {
                match flush_locked(&mut st.conn, &self.tcp) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wake.notify_one(),
                    Err(e) => return Err(e),
                    Ok(()) => {}
                }
            }
        }
    }

    /// Whether decrypted bytes are waiting (the socket may not signal readability for them).
    pub fn has_buffered(&self) -> bool {
        let st = self.state.lock();
        st.buffered > 0 || st.closed
    }

    /// Whether encrypted records wait for the socket.
    pub fn wants_write(&self) -> bool {
        self.state.lock().conn.wants_write()
    }

    /// Writes waiting records; `WouldBlock` when the socket is full again.
    pub fn flush(&self) -> io::Result<()> {
        let mut st = self.state.lock();
        flush_locked(&mut st.conn, &self.tcp)
    }

    /// Resolves when a writer left records behind for the connection task.
    pub async fn notified(&self) {
        self.wake.notified().await
    }

    /// Queues a close_notify alert (written by the next [`flush`](Self::flush)).
    pub fn close_notify(&self) {
        self.state.lock().conn.send_close_notify();
    }
}

impl Wire for TlsWire {
    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        let mut st = self.state.lock();
        // Earlier records first: the outbox blocks (and the connection task waits for
        // writability) until they are out, which bounds what rustls buffers.
        flush_locked(&mut st.conn, &self.tcp)?;
        let n = st.conn.writer().write(buf)?;
        if n == 0 && !buf.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        match flush_locked(&mut st.conn, &self.tcp) {
            Ok(()) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                drop(st);
                self.wake.notify_one();
                Ok(n)
            }
            Err(e) => Err(e),
        }
    }
}
