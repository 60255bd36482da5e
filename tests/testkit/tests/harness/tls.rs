//! The HTTPS registry and its broken variants against real clients: skopeo (Go's crypto/tls),
//! curl (OpenSSL) and rustls (what the workspace's binaries use). Each failure's own words are
//! printed (`--nocapture`) and checked.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use runr_testkit::oci::TestImage;
use runr_testkit::pki::Ca;
use runr_testkit::tls::WRONG_NAME;
use runr_testkit::tools::{curl_output, skopeo_output, ToolOutput};
use runr_testkit::{Registry, TlsRegistry, TlsVariant};

fn push(image: &TestImage, host: &str, args: &[&str]) -> ToolOutput {
    let dest = format!("docker://{host}/app:{}", image.tag);
    let src = image.oci_ref();
    let mut all = vec!["copy", "--retry-times", "0", "--preserve-digests"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[src.as_str(), dest.as_str()]);
    skopeo_output(&all)
}

fn cert_dir_arg(p: &Path) -> String {
    p.display().to_string()
}

/// `GET /v2/` over rustls with only `ca` (if any) as root: the answer's status line, or the
/// TLS error as the binaries would see it.
fn rustls_get(addr: SocketAddr, name: &str, ca: Option<&Path>) -> Result<String, rustls::Error> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = ca {
        for cert in CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let server_name = ServerName::try_from(name.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), server_name).unwrap();
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    let io = |e: std::io::Error| -> rustls::Error {
        match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(inner) => inner.clone(),
            None => panic!("not a TLS error: {e}"),
        }
    };
    tls.write_all(b"GET /v2/ HTTP/1.1\r\nHost: registry\r\nConnection: close\r\n\r\n")
        .map_err(io)?;
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer);
    Ok(String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or("")
        .to_string())
}

#[test]
fn a_valid_certificate_works_with_its_ca_and_only_with_it() {
    let reg = TlsRegistry::start();
    assert!(reg.url().starts_with("https://127.0.0.1:"));
    let image = TestImage::random("1", &[2_000]);
    let cert_dir = cert_dir_arg(reg.cert_dir());

    let ok = push(&image, &reg.host(), &["--dest-cert-dir", &cert_dir]);
    assert!(ok.success(), "{ok:?}");
    // By its DNS name too.
    let ok = push(&image, &reg.localhost(), &["--dest-cert-dir", &cert_dir]);
    assert!(ok.success(), "{ok:?}");
    let ca = reg.ca_file().display().to_string();
    let curl = curl_output(&["-i", "--cacert", &ca, &format!("{}/v2/", reg.url())]);
    assert!(curl.success(), "{curl:?}");
    assert!(curl.stdout.starts_with("HTTP/2 200"), "{}", curl.stdout);
    assert!(curl.stdout.ends_with("\r\n\r\n{}"), "{}", curl.stdout);
    assert_eq!(
        rustls_get(reg.addr(), "127.0.0.1", Some(reg.ca_file())),
        Ok("HTTP/1.1 200 OK".to_string())
    );

    // No CA given: the system roots do not know it.
    let none = push(&image, &reg.host(), &[]);
    assert!(!none.success());
    eprintln!("skopeo, CA not given: {}", none.last_error_line());
    assert!(
        none.stderr
            .contains("x509: certificate signed by unknown authority"),
        "{}",
        none.stderr
    );
    let curl = curl_output(&[&format!("{}/v2/", reg.url())]);
    assert_eq!(curl.status.code(), Some(60), "{curl:?}");
    eprintln!(
        "curl, CA not given: {}",
        curl.stderr.lines().next().unwrap()
    );
    assert!(curl
        .stderr
        .starts_with("curl: (60) SSL certificate problem: unable to get local issuer certificate"));
    let err = rustls_get(reg.addr(), "127.0.0.1", None).unwrap_err();
    eprintln!("rustls, CA not given: {err}");
    assert_eq!(
        err,
        rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
    );

    // Another CA given: the same failure.
    let other = Ca::new("some other CA");
    let wrong = push(
        &image,
        &reg.host(),
        &["--dest-cert-dir", &cert_dir_arg(other.cert_dir())],
    );
    assert!(!wrong.success());
    eprintln!("skopeo, another CA: {}", wrong.last_error_line());
    assert!(wrong
        .stderr
        .contains("x509: certificate signed by unknown authority"));
    let curl = curl_output(&[
        "--cacert",
        &other.cert_file().display().to_string(),
        &format!("{}/v2/", reg.url()),
    ]);
    assert_eq!(curl.status.code(), Some(60));
    eprintln!("curl, another CA: {}", curl.stderr.lines().next().unwrap());
    assert!(curl
        .stderr
        .starts_with("curl: (60) SSL certificate problem: unable to get local issuer certificate"));
    assert_eq!(
        rustls_get(reg.addr(), "127.0.0.1", Some(other.cert_file())),
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer
        ))
    );

    // Verification off: the server itself is fine.
    let off = push(&image, &reg.host(), &["--dest-tls-verify=false"]);
    assert!(off.success(), "{off:?}");
}

/// Every broken certificate is refused by each client with its own words even though the
/// client has the right CA, and is fine with verification off.
#[test]
fn broken_certificates_fail_with_their_own_errors() {
    let image = TestImage::random("1", &[1_000]);
    for (variant, skopeo_ip, skopeo_dns, curl_says, rustls_says) in [
        (
            TlsVariant::WrongName,
            "x509: cannot validate certificate for 127.0.0.1 because it doesn't contain any IP SANs",
            "x509: certificate is valid for wrong.example, not localhost",
            "curl: (60) SSL: no alternative certificate subject name matches target host name '127.0.0.1'",
            "certificate not valid for name",
        ),
        (
            TlsVariant::Expired,
            "x509: certificate has expired or is not yet valid: current time ",
            "x509: certificate has expired or is not yet valid: current time ",
            "curl: (60) SSL certificate problem: certificate has expired",
            "certificate expired",
        ),
        (
            TlsVariant::NotYetValid,
            "x509: certificate has expired or is not yet valid: current time ",
            "x509: certificate has expired or is not yet valid: current time ",
            "curl: (60) SSL certificate problem: certificate is not yet valid",
            "certificate not valid yet",
        ),
    ] {
        let reg = TlsRegistry::start_variant(variant);
        assert_eq!(reg.variant(), variant);
        let cert_dir = cert_dir_arg(reg.cert_dir());
        for (host, want) in [(reg.host(), skopeo_ip), (reg.localhost(), skopeo_dns)] {
            let out = push(&image, &host, &["--dest-cert-dir", &cert_dir]);
            assert!(!out.success(), "{variant:?} via {host}");
            eprintln!("skopeo, {variant:?} via {host}: {}", out.last_error_line());
            assert!(out.stderr.contains(want), "{variant:?}: {}", out.stderr);
        }
        let curl = curl_output(&[
            "--cacert",
            &reg.ca_file().display().to_string(),
            &format!("{}/v2/", reg.url()),
        ]);
        assert_eq!(curl.status.code(), Some(60), "{variant:?}: {curl:?}");
        eprintln!("curl, {variant:?}: {}", curl.stderr.lines().next().unwrap());
        assert!(curl.stderr.starts_with(curl_says), "{variant:?}: {}", curl.stderr);
        let err = rustls_get(reg.addr(), "127.0.0.1", Some(reg.ca_file())).unwrap_err();
        eprintln!("rustls, {variant:?}: {err}");
        assert!(err.to_string().contains(rustls_says), "{variant:?}: {err}");
        let expected_kind = match (&err, variant) {
            (
                rustls::Error::InvalidCertificate(
                    rustls::CertificateError::NotValidForNameContext { presented, .. },
                ),
                TlsVariant::WrongName,
            ) => presented == &[format!("DnsName(\"{WRONG_NAME}\")")],
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::ExpiredContext {
                    ..
                }),
                TlsVariant::Expired,
            ) => true,
            (
                rustls::Error::InvalidCertificate(
                    rustls::CertificateError::NotValidYetContext { .. },
                ),
                TlsVariant::NotYetValid,
            ) => true,
            _ => false,
        };
        assert!(expected_kind, "{variant:?}: {err:?}");

        let curl = curl_output(&["-k", &format!("{}/v2/", reg.url())]);
        assert_eq!(curl.stdout, "{}", "{variant:?}: {curl:?}");
        let off = push(&image, &reg.host(), &["--dest-tls-verify=false"]);
        assert!(off.success(), "{variant:?}: {off:?}");
    }
}

#[test]
fn a_tls_pull_through_cache() {
    let upstream = Registry::start();
    let image = TestImage::random("1", &[30_000]);
    assert!(push(&image, &upstream.host(), &["--dest-tls-verify=false"]).success());
    let mut cache = TlsRegistry::start_proxy(&upstream.url());
    let cert_dir = cert_dir_arg(cache.cert_dir());
    let pull = |cache: &TlsRegistry| {
        let out = tempfile::tempdir().unwrap();
        skopeo_output(&[
            "copy",
            "--retry-times",
            "0",
            "--src-cert-dir",
            &cert_dir,
            &format!("docker://{}/app:1", cache.host()),
            &format!("dir:{}", out.path().display()),
        ])
    };
    let first = pull(&cache);
    assert!(first.success(), "{first:?}\n{}", cache.log());
    // The cache stores what it relayed after the answer; a restart in the middle of that leaves
    // a blob it then answers 500 for, so the restart waits until the layer and the config are
    // stored whole.
    let stored = |cache: &TlsRegistry, blob: &runr_testkit::oci::Blob| {
        let held = runr_testkit::stored_blob(&cache.storage(), &blob.digest);
        std::fs::read(held).ok().is_some_and(|d| d == blob.data)
    };
    for blob in [&image.layers[0], &image.config] {
        runr_testkit::wait_for(
            "the cache to store the layer and the config",
            std::time::Duration::from_secs(30),
            || stored(&cache, blob).then_some(()),
        );
    }
    cache.restart();
    let again = pull(&cache);
    assert!(again.success(), "same port, same certificate: {again:?}");
    assert!(
        stored(&cache, &image.layers[0]),
        "the layer is still stored"
    );
}
