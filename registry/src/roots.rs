//! A system CA store for processes that have none (FROM scratch).
//!
//! Why this exists: oci-client 0.18's `Client::try_from(config)` finishes with
//! `..Default::default()`, which builds a second, throwaway `reqwest::Client::default()`. With
//! reqwest 0.13's rustls that default client uses the platform verifier, which loads the system
//! CA store and fails (reqwest then panics) when the store is empty, as it is in a scratch image.
//! Our own clients trust only the compiled-in roots (`tls_certs_only`) and never consult the
//! system store, so all we need is for the store to be non-empty: point `SSL_CERT_FILE` (read by
//! rustls-native-certs) at an in-memory file holding those same compiled-in roots.

use std::io::Write;
use std::os::fd::{AsRawFd, IntoRawFd};

use runr_base::roots::pem_bundle;

/// Where Debian, Alpine, Fedora and friends keep their bundles; any of them makes this a no-op.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];

/// Makes sure the process has a system CA store, creating an in-memory one from the built-in
/// roots when there is none. Call it at the very start of `main`, before any thread is started:
/// it may set `SSL_CERT_FILE`, and the environment must not change while other threads read it.
pub fn ensure_system_roots() -> std::io::Result<()> {
    if std::env::var_os("SSL_CERT_FILE").is_some() || std::env::var_os("SSL_CERT_DIR").is_some() {
        return Ok(());
    }
    if SYSTEM_BUNDLES
        .iter()
        .any(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
    {
        return Ok(());
    }
    // A memfd needs no writable filesystem (the receiver runs with a read-only root) and lives as
    // long as the process; the descriptor is deliberately leaked for that reason.
    let fd = nix::sys::memfd::memfd_create(
        c"runr-ca-roots",
        nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(pem_bundle().as_bytes())?;
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let _ = file.into_raw_fd();
    std::env::set_var("SSL_CERT_FILE", path);
    Ok(())
}
