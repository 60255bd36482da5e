//! The real `docker-registry` serving HTTPS (`http.tls.certificate`/`key`) with a certificate
//! from a [`Ca`] made for it, and the broken variants a client must tell apart: a certificate
//! for another name, an expired one, one not valid yet. "A CA the client is not given" is the
//! valid registry with the client given no CA file or another [`Ca`]'s.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::distribution::Distribution;
use crate::pki::{Ca, ServerCert, Validity};

/// The only name in the certificate of [`TlsVariant::WrongName`].
pub const WRONG_NAME: &str = "wrong.example";

/// Which certificate the registry serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVariant {
    /// For `127.0.0.1` and `localhost`, valid now.
    Valid,
    /// For [`WRONG_NAME`] only (neither `127.0.0.1` nor `localhost`), valid now.
    WrongName,
    /// For `127.0.0.1` and `localhost`, valid from two days ago until one day ago.
    Expired,
    /// For `127.0.0.1` and `localhost`, valid from tomorrow on.
    NotYetValid,
}

impl TlsVariant {
    fn names(self) -> &'static [&'static str] {
        match self {
            TlsVariant::WrongName => &[WRONG_NAME],
            _ => &["127.0.0.1", "localhost"],
        }
    }

    fn validity(self) -> Validity {
        match self {
            TlsVariant::Expired => Validity::Expired,
            TlsVariant::NotYetValid => Validity::NotYetValid,
            TlsVariant::Valid | TlsVariant::WrongName => Validity::Current,
        }
    }
}

/// A `docker-registry` on a free loopback port serving HTTPS; stopped on drop, its storage,
/// CA and keys removed.
pub struct TlsRegistry {
    dist: Distribution,
    ca: Ca,
    cert: ServerCert,
    variant: TlsVariant,
}

impl TlsRegistry {
    /// A plain registry with a valid certificate for `127.0.0.1` and `localhost`.
    pub fn start() -> TlsRegistry {
        Self::start_with(TlsVariant::Valid, None)
    }

    /// A plain registry serving the certificate of `variant`.
    pub fn start_variant(variant: TlsVariant) -> TlsRegistry {
        Self::start_with(variant, None)
    }

    /// A pull-through cache of `upstream` (`http://127.0.0.1:port`) with a valid certificate.
    pub fn start_proxy(upstream: &str) -> TlsRegistry {
        Self::start_with(TlsVariant::Valid, Some(upstream))
    }

    /// A registry serving the certificate of `variant`, a pull-through cache of `upstream` when
    /// given.
    pub fn start_with(variant: TlsVariant, upstream: Option<&str>) -> TlsRegistry {
        let ca = Ca::new("runr test registry CA");
        let cert = ca.issue(variant.names(), variant.validity());
        let mut dist = Distribution::new("runr-tls-registry-");
        let extra = match upstream {
            Some(url) => format!("proxy:\n  remoteurl: {url}\n"),
            None => String::new(),
        };
        dist.configure(extra, Some((cert.cert.clone(), cert.key.clone())));
        dist.start();
        TlsRegistry {
            dist,
            ca,
            cert,
            variant,
        }
    }

    /// The certificate it serves.
    pub fn variant(&self) -> TlsVariant {
        self.variant
    }

    /// The CA that signed its certificate.
    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// The CA certificate (PEM), for `curl --cacert`, `RUNR_REGISTRY_CA_FILE`, ….
    pub fn ca_file(&self) -> &Path {
        self.ca.cert_file()
    }

    /// A directory holding only the CA as `ca.crt`, for `skopeo --dest-cert-dir` /
    /// `--src-cert-dir`.
    pub fn cert_dir(&self) -> &Path {
        self.ca.cert_dir()
    }

    /// The server certificate and key it serves.
    pub fn server_cert(&self) -> &ServerCert {
        &self.cert
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.dist.addr()
    }

    /// `127.0.0.1:<port>` as a string, the form image references and skopeo use.
    pub fn host(&self) -> String {
        self.addr().to_string()
    }

    /// `localhost:<port>`, the same registry by a DNS name (for name checks).
    pub fn localhost(&self) -> String {
        format!("localhost:{}", self.addr().port())
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr())
    }

    /// Stops the registry (SIGKILL to its group); storage stays.
    pub fn stop(&mut self) {
        self.dist.stop();
    }

    /// Starts it again on the same port, storage and certificate.
    pub fn restart(&mut self) {
        self.dist.restart();
    }

    /// The registry's storage root on disk.
    pub fn storage(&self) -> PathBuf {
        self.dist.storage()
    }

    /// The registry's own log (Go's `http: TLS handshake error` lines show what it saw).
    pub fn log(&self) -> String {
        self.dist.log()
    }
}
