//! A cache served over HTTPS: with its CA given it is warmed; a certificate from a CA prewarm
//! was not given, for another name, expired or not valid yet fails every image at once
//! (not after RUNR_PREWARM_WAIT) with the certificate problem in rustls's words, exit 1.

use runr_testkit::pki::Ca;
use runr_testkit::{have_tool, TlsRegistry, TlsVariant};

use super::{pull, with};
use crate::support::{base_env, run};
use crate::{tools_present, upstream};

fn tls_tools() -> bool {
    tools_present() && have_tool("openssl")
}

fn tls_env(host: &str, images: &str, ca: Option<&std::path::Path>) -> Vec<(String, String)> {
    let mut extra = vec![("RUNR_REGISTRY_PLAIN_HTTP", "0".to_string())];
    if let Some(ca) = ca {
        extra.push(("RUNR_REGISTRY_CA_FILE", ca.display().to_string()));
    }
    let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
    with(&base_env(host, images), &extra)
}

#[test]
fn a_tls_cache_with_its_ca_is_warmed() {
    if !tls_tools() {
        return;
    }
    let mut up = upstream();
    let cache = TlsRegistry::start_proxy(&up.registry.url());
    let done = run(&tls_env(
        &cache.host(),
        "small:1 big:1",
        Some(cache.ca_file()),
    ));
    assert_eq!(done.code, 0, "{done:?}\n--- cache log:\n{}", cache.log());
    assert_eq!(done.summary()["warmed"], 2, "{done:?}");
    up.registry.stop();
    let cert_dir = cache.cert_dir().display().to_string();
    for image in ["small:1", "big:1"] {
        pull(&cache.host(), image, &["--src-cert-dir", &cert_dir])
            .unwrap_or_else(|e| panic!("{image}: {e}"));
    }
}

#[test]
fn a_bad_certificate_fails_every_image_at_once_naming_the_problem() {
    if !tls_tools() {
        return;
    }
    let other = Ca::new("a CA the registry does not use");
    /// Which CA file prewarm is given.
    enum Trust {
        Nothing,
        AnotherCa,
        ItsCa,
    }
    for (variant, trust, words) in [
        (
            TlsVariant::Valid,
            Trust::Nothing,
            "invalid peer certificate: UnknownIssuer",
        ),
        (
            TlsVariant::Valid,
            Trust::AnotherCa,
            "invalid peer certificate: UnknownIssuer",
        ),
        (
            TlsVariant::WrongName,
            Trust::ItsCa,
            "certificate not valid for name \"127.0.0.1\"; certificate is only valid for \
             DnsName(\"wrong.example\")",
        ),
        (TlsVariant::Expired, Trust::ItsCa, "certificate expired: "),
        (
            TlsVariant::NotYetValid,
            Trust::ItsCa,
            "certificate not valid yet: ",
        ),
    ] {
        let cache = TlsRegistry::start_variant(variant);
        let ca = match trust {
            Trust::Nothing => None,
            Trust::AnotherCa => Some(other.cert_file()),
            Trust::ItsCa => Some(cache.ca_file()),
        };
        let env = with(
            &tls_env(&cache.host(), "small:1 big:1", ca),
            // A certificate problem waited out would log "waiting for the registry" (checked below).
            &[("RUNR_PREWARM_WAIT", "90s")],
        );
        let done = run(&env);
        assert_eq!(done.code, 1, "{variant:?}: {done:?}");
        let summary = done.summary();
        assert_eq!(summary["failed"], 2, "{variant:?}: {done:?}");
        for image in summary["images"].as_array().unwrap() {
            let error = image["error"].as_str().unwrap();
            assert!(
                error.starts_with(&format!("TLS with the registry {} failed: ", cache.host())),
                "{variant:?}: {error}"
            );
            assert!(error.contains(words), "{variant:?}: {error}");
        }
        eprintln!("{variant:?}: {}", summary["images"][0]["error"]);
        assert!(
            done.stderr.contains("ERROR prewarm done with failures"),
            "{done:?}"
        );
        assert!(
            !done.stderr.contains("waiting for the registry"),
            "a certificate problem is not waited out: {done:?}"
        );
    }
}
