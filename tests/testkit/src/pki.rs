//! Certificates for tests, made with the `openssl` command line tool (Debian's openssl, 3.x) in
//! temporary directories: a [`Ca`] and server certificates it issues, valid, expired or not yet
//! valid, for any DNS names and IP addresses. Keys are EC P-256 (fast to make, accepted by Go's
//! crypto/tls, OpenSSL and rustls alike).
//!
//! OpenSSL 3.0 has no `x509 -not_before` (that came in 3.4), so certificates are signed with
//! `openssl ca`, whose `-startdate`/`-enddate` put the validity anywhere, past included.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::have_tool;

/// When a certificate is valid, relative to now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// From an hour ago to 30 days from now.
    Current,
    /// From two days ago to one day ago.
    Expired,
    /// From one day from now to 30 days from now.
    NotYetValid,
}

impl Validity {
    /// `(not_before, not_after)` as Unix seconds, relative to `now`.
    pub fn window(self, now: i64) -> (i64, i64) {
        const HOUR: i64 = 3600;
        const DAY: i64 = 24 * HOUR;
        match self {
            Validity::Current => (now - HOUR, now + 30 * DAY),
            Validity::Expired => (now - 2 * DAY, now - DAY),
            Validity::NotYetValid => (now + DAY, now + 30 * DAY),
        }
    }
}

/// A certificate and its private key (PEM files), issued by a [`Ca`] and living in its
/// directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerCert {
    /// The certificate (PEM, the leaf only).
    pub cert: PathBuf,
    /// Its private key (PEM, PKCS#8, unencrypted).
    pub key: PathBuf,
    /// The names in its subjectAltName, as given to [`Ca::issue`].
    pub names: Vec<String>,
    /// Start of validity, Unix seconds.
    pub not_before: i64,
    /// End of validity, Unix seconds.
    pub not_after: i64,
}

/// A certificate authority in a temporary directory (removed on drop, with every certificate
/// it issued).
pub struct Ca {
    dir: tempfile::TempDir,
    name: String,
    cert: PathBuf,
    cert_dir: PathBuf,
    issued: AtomicUsize,
    /// `openssl ca` keeps its serial and index in files: one signing at a time.
    signing: Mutex<()>,
}

impl Ca {
    /// A new self-signed CA whose certificate's subject is `CN=<name>`, valid for ten years
    /// from an hour ago.
    pub fn new(name: &str) -> Ca {
        assert!(
            have_tool("openssl"),
            "openssl is not installed (apt-get install openssl; .ci/run does this)"
        );
        let dir = tempfile::Builder::new()
            .prefix("runr-ca-")
            .tempdir()
            .expect("tempdir");
        let root = dir.path();
        std::fs::create_dir(root.join("newcerts")).expect("mkdir newcerts");
        std::fs::write(root.join("index.txt"), "").expect("write index.txt");
        std::fs::write(root.join("serial"), "1000\n").expect("write serial");
        std::fs::write(root.join("openssl.cnf"), ca_config(root)).expect("write openssl.cnf");
        let now = unix_now();
        let (start, end) = (now - 3600, now + 3650 * 24 * 3600);
        openssl(
            root,
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.csr",
                "-subj",
                &format!("/CN={name}"),
                "-config",
                "openssl.cnf",
            ],
        );
        std::fs::write(
            root.join("ca.ext"),
            "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n\
             subjectKeyIdentifier=hash\n",
        )
        .expect("write ca.ext");
        openssl(
            root,
            &[
                "ca",
                "-batch",
                "-config",
                "openssl.cnf",
                "-selfsign",
                "-keyfile",
                "ca.key",
                "-in",
                "ca.csr",
                "-out",
                "ca.crt",
                "-notext",
                "-startdate",
                &asn1_time(start),
                "-enddate",
                &asn1_time(end),
                "-extfile",
                "ca.ext",
            ],
        );
        let cert_dir = root.join("cert-dir");
        std::fs::create_dir(&cert_dir).expect("mkdir cert-dir");
        std::fs::copy(root.join("ca.crt"), cert_dir.join("ca.crt")).expect("copy ca.crt");
        Ca {
            cert: root.join("ca.crt"),
            cert_dir,
            dir,
            name: name.to_string(),
            issued: AtomicUsize::new(0),
            signing: Mutex::new(()),
        }
    }

    /// The CA's common name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The CA certificate (PEM): what `curl --cacert`, `RUNR_REGISTRY_CA_FILE` and friends take.
    pub fn cert_file(&self) -> &Path {
        &self.cert
    }

    /// A directory holding only `ca.crt` (this CA), the layout `skopeo --src-cert-dir` /
    /// `--dest-cert-dir` and containers' `certs.d/<host>/` read.
    pub fn cert_dir(&self) -> &Path {
        &self.cert_dir
    }

    /// Issues a server certificate for `names` (IP addresses become `IP:` entries of the
    /// subjectAltName, anything else `DNS:`; the first name is also the subject's CN), with
    /// serverAuth usage and the given validity.
    pub fn issue(&self, names: &[&str], validity: Validity) -> ServerCert {
        assert!(!names.is_empty(), "a certificate needs at least one name");
        let n = self.issued.fetch_add(1, Ordering::SeqCst);
        let root = self.dir.path();
        let out = root.join(format!("issued-{n}"));
        std::fs::create_dir(&out).expect("mkdir issued");
        let key = out.join("key.pem");
        let csr = out.join("req.csr");
        let cert = out.join("cert.pem");
        let ext = out.join("ext.cnf");
        let san = names
            .iter()
            .map(|n| match n.parse::<IpAddr>() {
                Ok(_) => format!("IP:{n}"),
                Err(_) => format!("DNS:{n}"),
            })
            .collect::<Vec<_>>()
            .join(",");
        std::fs::write(
            &ext,
            format!(
                "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
                 extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\n\
                 authorityKeyIdentifier=keyid\nsubjectAltName={san}\n"
            ),
        )
        .expect("write ext.cnf");
        openssl(
            root,
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                path_str(&key),
                "-out",
                path_str(&csr),
                "-subj",
                &format!("/CN={}", names[0]),
                "-config",
                "openssl.cnf",
            ],
        );
        let (not_before, not_after) = validity.window(unix_now());
        {
            let _one = self.signing.lock().unwrap_or_else(|e| e.into_inner());
            openssl(
                root,
                &[
                    "ca",
                    "-batch",
                    "-config",
                    "openssl.cnf",
                    "-in",
                    path_str(&csr),
                    "-out",
                    path_str(&cert),
                    "-notext",
                    "-startdate",
                    &asn1_time(not_before),
                    "-enddate",
                    &asn1_time(not_after),
                    "-extfile",
                    path_str(&ext),
                ],
            );
        }
        ServerCert {
            cert,
            key,
            names: names.iter().map(|s| s.to_string()).collect(),
            not_before,
            not_after,
        }
    }
}

/// A minimal `openssl ca` configuration rooted at `dir`: any subject, SHA-256, no extensions
/// copied from requests (every extension comes from the extension file of the signing).
fn ca_config(dir: &Path) -> String {
    format!(
        "[ ca ]\ndefault_ca = runr\n\n[ runr ]\ndir = {dir}\ndatabase = $dir/index.txt\n\
         new_certs_dir = $dir/newcerts\ncertificate = $dir/ca.crt\nprivate_key = $dir/ca.key\n\
         serial = $dir/serial\ndefault_md = sha256\npolicy = any\nunique_subject = no\n\
         email_in_dn = no\ncopy_extensions = none\n\n[ any ]\ncommonName = supplied\n\n\
         [ req ]\ndistinguished_name = dn\nprompt = no\n\n[ dn ]\nCN = unused\n",
        dir = dir.display()
    )
}

/// A configuration for `openssl req` alone (no system openssl.cnf is read).
pub(crate) fn req_config() -> &'static str {
    "[ req ]\ndistinguished_name = dn\nprompt = no\n\n[ dn ]\nCN = unused\n"
}

/// Runs `openssl args…` in `dir` and returns its stdout; panics with its stderr when it fails.
pub(crate) fn openssl(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .env("OPENSSL_CONF", "/dev/null")
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

/// `(year, month, day, hour, minute, second)` in UTC of Unix time `secs`.
fn utc(secs: i64) -> (i64, u32, u32, u32, u32, u32) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
    )
}

/// `YYYYMMDDHHMMSSZ`, the GeneralizedTime form `openssl ca -startdate/-enddate` take.
pub(crate) fn asn1_time(secs: i64) -> String {
    let (y, mo, d, h, mi, s) = utc(secs);
    format!("{y:04}{mo:02}{d:02}{h:02}{mi:02}{s:02}Z")
}

/// `YYYY-MM-DDTHH:MM:SSZ` (RFC 3339, UTC).
pub(crate) fn rfc3339(secs: i64) -> String {
    let (y, mo, d, h, mi, s) = utc(secs);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(asn1_time(0), "19700101000000Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_798_761_599), "2026-12-31T23:59:59Z");
        assert_eq!(asn1_time(-1), "19691231235959Z");
        assert_eq!(rfc3339(4_107_542_400), "2100-03-01T00:00:00Z");
    }

    /// What openssl itself reads back from each certificate: names, dates, and whether it
    /// verifies against the CA (and which error when it does not).
    #[test]
    fn issued_certificates_say_what_was_asked() {
        let ca = Ca::new("runr test CA");
        let tmp = ca.dir.path();
        let verify = |cert: &Path| {
            let out = Command::new("openssl")
                .args(["verify", "-CAfile"])
                .arg(ca.cert_file())
                .arg(cert)
                .current_dir(tmp)
                .output()
                .unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr),
            )
        };
        let show = |cert: &Path, what: &str| {
            String::from_utf8(openssl(
                tmp,
                &["x509", "-in", path_str(cert), "-noout", "-ext", what],
            ))
            .unwrap()
        };

        let good = ca.issue(&["127.0.0.1", "localhost"], Validity::Current);
        let (ok, text) = verify(&good.cert);
        assert!(ok, "{text}");
        let san = show(&good.cert, "subjectAltName");
        assert!(san.contains("IP Address:127.0.0.1, DNS:localhost"), "{san}");
        let now = unix_now();
        assert!(good.not_before < now && good.not_after > now);
        let dates = String::from_utf8(openssl(
            tmp,
            &["x509", "-in", path_str(&good.cert), "-noout", "-startdate"],
        ))
        .unwrap();
        let (y, ..) = utc(good.not_before);
        assert!(dates.contains(&y.to_string()), "{dates}");

        let expired = ca.issue(&["127.0.0.1"], Validity::Expired);
        let (ok, text) = verify(&expired.cert);
        assert!(!ok && text.contains("certificate has expired"), "{text}");
        let early = ca.issue(&["127.0.0.1"], Validity::NotYetValid);
        let (ok, text) = verify(&early.cert);
        assert!(
            !ok && text.contains("certificate is not yet valid"),
            "{text}"
        );

        let other = Ca::new("another CA");
        let out = Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(other.cert_file())
            .arg(&good.cert)
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("unable to get local issuer"));

        let basic = show(ca.cert_file(), "basicConstraints");
        assert!(basic.contains("CA:TRUE"), "{basic}");
        assert_eq!(
            std::fs::read(ca.cert_dir().join("ca.crt")).unwrap(),
            std::fs::read(ca.cert_file()).unwrap()
        );
    }
}
