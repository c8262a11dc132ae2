//! [`TlsRedis`]: a `redis-server` that also listens with TLS, and the throwaway certificate
//! authority it is signed by.
//!
//! The certificates are made with the `openssl` command line (Debian's `openssl` package) in
//! the server's scratch directory: a CA, and a server certificate for `127.0.0.1` and
//! `localhost` signed by it, valid for two days. A second, unrelated CA is made too, for tests
//! that must see verification fail.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::port;
use crate::scratch::Scratch;
use crate::server::RedisServer;

/// A server with a plain port (for the kit's own readiness checks and commands) and a TLS port.
pub struct TlsRedis {
    pub server: RedisServer,
    tls_port: u16,
    // Holds the certificates; removed on drop, after the server.
    certs: Scratch,
}

impl TlsRedis {
    /// Makes the certificates and starts the server; returns once its plain port answers
    /// `PING`.
    pub fn start() -> TlsRedis {
        let certs = Scratch::new("tls");
        let dir = certs.path();
        make_ca(dir, "ca");
        make_ca(dir, "other-ca");
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        );
        std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").expect("write san.ext");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ],
        );
        let tls_port = port::spare();
        let path = |f: &str| dir.join(f).display().to_string();
        let server = RedisServer::start_with(&[
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &path("server.pem"),
            "--tls-key-file",
            &path("server.key"),
            "--tls-ca-cert-file",
            &path("ca.pem"),
            "--tls-auth-clients",
            "no",
        ]);
        TlsRedis { server, tls_port, certs }
    }

    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// The CA that signed the server's certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.certs.path().join("ca.pem")
    }

    /// A CA that did not sign it.
    pub fn other_ca(&self) -> PathBuf {
        self.certs.path().join("other-ca.pem")
    }

    /// `rediss://127.0.0.1:TLS_PORT/0?tls_ca=<ca>`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/0?tls_ca={}", self.tls_port, self.ca().display())
    }
}

fn make_ca(dir: &Path, name: &str) {
    let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
    let subject = format!("/CN={name}");
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &pem, "-days", "2", "-subj",
            &subject,
        ],
    );
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("openssl not runnable (apt-get install -y openssl): {e}"));
    assert!(out.status.success(), "openssl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}
