//! What a failed registry request means to the operator who has to fix it, the same for both
//! binaries:
//!
//! - an **authentication or authorization refusal** ([`AuthFailure`]): the message says so first,
//!   names the registry and quotes the answer of whoever refused, the token service (wrong
//!   credentials) or the registry itself (a token without the scope, a 403);
//! - a **TLS failure** ([`TlsFailure`]): a certificate from an unknown CA, for another name,
//!   expired or not valid yet, or TLS spoken to a plain-HTTP registry. These are configuration
//!   errors: another attempt, or waiting for a "restart", cannot cure them, so callers fail at
//!   once with rustls's own words for the problem.
//!
//! Everything else keeps its own message; [`crate::retry::is_transient`] decides whether it is
//! worth another attempt.

use std::fmt;

use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};

/// Bytes of an error answer quoted in a message: registries explain a refusal in a small JSON
/// envelope; a proxy's error page can be large and is only there to be recognised.
pub const ANSWER_QUOTE_LIMIT: usize = 512;

/// The start of an answer's body as one line: whitespace runs (the trailing newline of Go's JSON
/// encoder, a pretty-printed envelope, an HTML page) collapse to one space, other control
/// characters are escaped (`\u{1b}`: the text came from the network), and at most
/// [`ANSWER_QUOTE_LIMIT`] bytes are kept, cut at a character boundary.
pub fn quote_answer(body: &[u8]) -> String {
    // More than the limit can hold even after collapsing; the rest is never looked at.
    let text = String::from_utf8_lossy(&body[..body.len().min(4 * ANSWER_QUOTE_LIMIT)]);
    let mut out = String::with_capacity(ANSWER_QUOTE_LIMIT + 16);
    for word in text.split_whitespace() {
        if out.len() >= ANSWER_QUOTE_LIMIT {
            break;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        runr_base::fmt::push_escaped(&mut out, word);
    }
    if out.len() > ANSWER_QUOTE_LIMIT {
        let mut cut = ANSWER_QUOTE_LIMIT;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.truncate(out.trim_end().len());
    }
    out
}

// === AuthFailure ===

/// Who refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefusedBy {
    /// The token service the registry's challenge named would not issue a token (wrong user or
    /// password, or no credentials where it wants some).
    TokenService,
    /// The registry answered 401 or 403 to a request with Basic credentials (or none): a wrong
    /// user or password for a registry without a token service, a user without the right.
    Registry {
        /// 401 or 403.
        status: u16,
    },
    /// The token service issued a token, and the registry refused the request made with it:
    /// the token does not grant the access (distribution answers 401 `insufficient_scope`).
    TokenScope {
        /// 401 or 403.
        status: u16,
    },
}

/// The registry, or its token service, refused the credentials or the access asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthFailure {
    /// The registry, `host[:port]`.
    pub registry: String,
    /// The repository the access was for.
    pub repository: String,
    /// The user name sent (`RUNR_REGISTRY_USERNAME`), `None` for an anonymous request.
    pub user: Option<String>,
    /// Who refused.
    pub refused_by: RefusedBy,
    /// The start of the refusal's body, as [`quote_answer`] makes it (empty when it had none,
    /// e.g. the answer to a HEAD).
    pub answer: String,
}

impl AuthFailure {
    /// A refusal for a request to `repository` at `registry` made with `auth`.
    pub fn new(
        registry: &str,
        repository: &str,
        auth: &RegistryAuth,
        refused_by: RefusedBy,
        answer: &[u8],
    ) -> AuthFailure {
        AuthFailure {
            registry: registry.to_string(),
            repository: repository.to_string(),
            user: match auth {
                RegistryAuth::Basic(user, _) => Some(user.clone()),
                _ => None,
            },
            refused_by,
            answer: quote_answer(answer),
        }
    }
}

impl fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.refused_by {
            RefusedBy::TokenService | RefusedBy::Registry { status: 401 } => "authentication",
            RefusedBy::Registry { .. } | RefusedBy::TokenScope { .. } => "authorization",
        };
        write!(
            f,
            "{kind} failed at the registry {} (repository {}, ",
            self.registry, self.repository
        )?;
        match &self.user {
            Some(user) => write!(f, "user {user:?})")?,
            None => f.write_str("no credentials: RUNR_REGISTRY_USERNAME is unset)")?,
        }
        match self.refused_by {
            RefusedBy::TokenService => f.write_str(": its token service answered")?,
            RefusedBy::Registry { status } => write!(f, ": it answered HTTP {status}")?,
            RefusedBy::TokenScope { status } => write!(
                f,
                ": the token its token service issued does not grant the access; it answered \
                 HTTP {status}"
            )?,
        }
        if self.answer.is_empty() {
            Ok(())
        } else {
            write!(f, ": {}", self.answer)
        }
    }
}

impl std::error::Error for AuthFailure {}

// === TlsFailure ===

/// What kind of TLS problem it was, for the hint that goes with rustls's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsProblem {
    /// The certificate chain does not end at a trusted root.
    UnknownIssuer,
    /// The certificate is for other names than the one the registry was reached by.
    WrongName,
    /// The certificate's validity ended.
    Expired,
    /// The certificate's validity has not begun.
    NotValidYet,
    /// Another certificate problem (bad signature, revoked, wrong purpose, …).
    OtherCertificate,
    /// Not TLS at all on the other end (a plain-HTTP registry), or a handshake rustls refuses.
    Handshake,
}

/// A TLS handshake with the registry failed: a configuration error, not a passing fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFailure {
    /// The registry, `host[:port]`.
    pub registry: String,
    /// What kind of problem.
    pub problem: TlsProblem,
    /// rustls's own words, e.g. `invalid peer certificate: UnknownIssuer`.
    pub detail: String,
}

impl TlsFailure {
    /// The TLS failure inside `err` (anywhere in its source chain), for a request to `registry`;
    /// `None` when `err` is not one.
    pub fn find(registry: &str, err: &(dyn std::error::Error + 'static)) -> Option<TlsFailure> {
        let tls = rustls_error(err)?;
        Some(TlsFailure {
            registry: registry.to_string(),
            problem: problem_of(tls),
            detail: tls.to_string(),
        })
    }

    fn hint(&self) -> &'static str {
        match self.problem {
            TlsProblem::UnknownIssuer => {
                "its certificate is not signed by a CA this binary trusts: the built-in roots \
                 and RUNR_REGISTRY_CA_FILE"
            }
            TlsProblem::WrongName => "its certificate is not for the name it was reached by",
            TlsProblem::Expired | TlsProblem::NotValidYet => {
                "check the certificate's validity dates and this machine's clock"
            }
            TlsProblem::OtherCertificate => "its certificate is refused",
            TlsProblem::Handshake => {
                "is it speaking TLS? RUNR_REGISTRY_PLAIN_HTTP=1 is for a registry without TLS"
            }
        }
    }
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TLS with the registry {} failed: {} ({})",
            self.registry,
            self.detail,
            self.hint()
        )
    }
}

impl std::error::Error for TlsFailure {}

/// The rustls error somewhere in `err`'s chain. reqwest reports a failed handshake as a connect
/// error whose chain holds an `io::Error` wrapping an `io::Error` wrapping the `rustls::Error`;
/// `io::Error::source` skips what it wraps, so each link is also unwrapped with `get_ref`.
fn rustls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    // Bounds the walk: a chain is a handful of links, a cycle would be a bug elsewhere.
    const MAX_LINKS: usize = 32;
    let mut link = Some(err);
    for _ in 0..MAX_LINKS {
        let mut e = link?;
        // Into what io::Errors wrap, as deep as they go.
        for _ in 0..MAX_LINKS {
            if let Some(tls) = e.downcast_ref::<rustls::Error>() {
                return Some(tls);
            }
            match e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                Some(inner) => e = inner,
                None => break,
            }
        }
        link = link?.source();
    }
    None
}

fn problem_of(err: &rustls::Error) -> TlsProblem {
    use rustls::CertificateError as C;
    match err {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => TlsProblem::UnknownIssuer,
            C::NotValidForName | C::NotValidForNameContext { .. } => TlsProblem::WrongName,
            C::Expired | C::ExpiredContext { .. } => TlsProblem::Expired,
            C::NotValidYet | C::NotValidYetContext { .. } => TlsProblem::NotValidYet,
            _ => TlsProblem::OtherCertificate,
        },
        _ => TlsProblem::Handshake,
    }
}

// === oci-client errors ===

/// An operator-facing reading of a failed oci-client request, when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Diagnosis {
    /// Credentials or access refused.
    Auth(AuthFailure),
    /// The TLS handshake failed.
    Tls(TlsFailure),
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Diagnosis::Auth(a) => a.fmt(f),
            Diagnosis::Tls(t) => t.fmt(f),
        }
    }
}

impl std::error::Error for Diagnosis {}

/// Reads `err`, which `client` returned for a request to `reference`'s repository made with
/// `auth` for `operation`: an authentication/authorization refusal or a TLS failure, or `None`
/// for anything else.
///
/// oci-client drops the token service's refusal when it fetches a token on its own before a
/// request (the request then goes out without one and the registry's 401 is all that is left),
/// so on a 401 or 403 this asks the token service once more, through [`Client::auth`], to quote
/// its answer; when the token service grants a token, the registry's refusal is quoted instead.
pub async fn diagnose(
    client: &Client,
    reference: &Reference,
    auth: &RegistryAuth,
    operation: RegistryOperation,
    err: &OciDistributionError,
) -> Option<Diagnosis> {
    let registry = reference.resolve_registry();
    if let Some(tls) = TlsFailure::find(registry, err) {
        return Some(Diagnosis::Tls(tls));
    }
    let (status, answer) = refusal(err)?;
    let refusal = match client.auth(reference, auth, operation).await {
        Err(OciDistributionError::AuthenticationFailure(body)) => AuthFailure::new(
            registry,
            reference.repository(),
            auth,
            RefusedBy::TokenService,
            body.as_bytes(),
        ),
        Err(e) => {
            if let Some(tls) = TlsFailure::find(registry, &e) {
                return Some(Diagnosis::Tls(tls));
            }
            AuthFailure::new(
                registry,
                reference.repository(),
                auth,
                RefusedBy::Registry { status },
                answer.as_bytes(),
            )
        }
        Ok(token) => AuthFailure::new(
            registry,
            reference.repository(),
            auth,
            match token {
                Some(_) => RefusedBy::TokenScope { status },
                None => RefusedBy::Registry { status },
            },
            answer.as_bytes(),
        ),
    };
    Some(Diagnosis::Auth(refusal))
}

/// 401 or 403 when `err` is the registry's (or token service's) refusal, in whatever shape
/// oci-client reported it; `None` for any other failure.
pub fn refusal_status(err: &OciDistributionError) -> Option<u16> {
    refusal(err).map(|(status, _)| status)
}

/// The status and answer of a 401/403 in whatever shape oci-client reported it.
fn refusal(err: &OciDistributionError) -> Option<(u16, String)> {
    match err {
        OciDistributionError::AuthenticationFailure(body) => Some((401, body.clone())),
        OciDistributionError::UnauthorizedError { .. } => Some((401, String::new())),
        OciDistributionError::RequestError(e) => match e.status().map(|s| s.as_u16()) {
            Some(code @ (401 | 403)) => Some((code, String::new())),
            _ => None,
        },
        OciDistributionError::ServerError { code, message, .. } if matches!(code, 401 | 403) => {
            Some((*code, message.clone()))
        }
        OciDistributionError::RegistryError { envelope, .. } => {
            let code = envelope.errors.iter().find_map(|e| match e.code {
                OciErrorCode::Unauthorized => Some(401),
                OciErrorCode::Denied => Some(403),
                _ => None,
            })?;
            Some((code, serde_json::to_string(envelope).unwrap_or_default()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = "{\"errors\":[{\"code\":\"UNAUTHORIZED\",\"message\":\"authentication \
                        required\",\"detail\":\"basic authentication challenge for realm \
                        \\\"runr-test-token\\\": authentication failure\"}]}\n";

    #[test]
    fn answers_are_quoted_on_one_line_and_bounded() {
        assert_eq!(quote_answer(b"{\"errors\":[]}\n"), "{\"errors\":[]}");
        assert_eq!(quote_answer(b"  a\n\tb \r\n c  "), "a b c");
        assert_eq!(quote_answer(b"a\x1b[31mb\0"), "a\\u{1b}[31mb\\u{0}");
        assert_eq!(quote_answer(b""), "");
        let long = "é".repeat(1000);
        let q = quote_answer(long.as_bytes());
        assert!(
            q.len() <= ANSWER_QUOTE_LIMIT && q.len() > ANSWER_QUOTE_LIMIT - 2,
            "{q}"
        );
        assert!(q.chars().all(|c| c == 'é'));
        let words = "word ".repeat(500);
        assert!(quote_answer(words.as_bytes()).len() <= ANSWER_QUOTE_LIMIT);
    }

    proptest::proptest! {
        // The answer is whatever a registry, proxy or token service sent: any bytes give one
        // bounded line of printable text, never a panic.
        #[test]
        fn any_answer_quotes_as_one_bounded_line(
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..3000)
        ) {
            let q = quote_answer(&body);
            proptest::prop_assert!(q.len() <= ANSWER_QUOTE_LIMIT, "{}", q.len());
            proptest::prop_assert!(!q.chars().any(char::is_control), "{q:?}");
            proptest::prop_assert!(!q.contains("  "), "{q:?}");
            proptest::prop_assert_eq!(q.trim(), q.as_str());
        }

        // Printable answers that fit are kept word for word.
        #[test]
        fn short_printable_answers_are_kept(
            words in proptest::collection::vec("[!-~]{1,12}", 0..30)
        ) {
            let body = words.join(" \n\t ");
            proptest::prop_assert_eq!(quote_answer(body.as_bytes()), words.join(" "));
        }
    }

    #[test]
    fn auth_failures_say_so_first_and_quote_the_answer() {
        let basic = RegistryAuth::Basic("runr".into(), "secret".into());
        let token = AuthFailure::new(
            "r:5000",
            "lib/app",
            &basic,
            RefusedBy::TokenService,
            BODY.as_bytes(),
        );
        let text = token.to_string();
        assert_eq!(
            text,
            format!(
                "authentication failed at the registry r:5000 (repository lib/app, user \
                 \"runr\"): its token service answered: {}",
                BODY.trim_end()
            )
        );
        assert!(!text.contains("secret") && !text.contains('\n'));

        let denied = AuthFailure::new(
            "r:5000",
            "app",
            &RegistryAuth::Anonymous,
            RefusedBy::Registry { status: 403 },
            b"",
        );
        assert_eq!(
            denied.to_string(),
            "authorization failed at the registry r:5000 (repository app, no credentials: \
             RUNR_REGISTRY_USERNAME is unset): it answered HTTP 403"
        );
        let unauthorized = AuthFailure {
            refused_by: RefusedBy::Registry { status: 401 },
            ..token.clone()
        };
        assert!(unauthorized
            .to_string()
            .starts_with("authentication failed at the registry r:5000"));
        let scope = AuthFailure {
            refused_by: RefusedBy::TokenScope { status: 401 },
            ..token
        };
        assert!(scope
            .to_string()
            .starts_with("authorization failed at the registry r:5000"));
    }

    #[test]
    fn oci_refusals_are_recognised_in_each_shape() {
        let envelope: oci_client::errors::OciEnvelope = serde_json::from_str(BODY).unwrap();
        let registry_error = OciDistributionError::RegistryError {
            envelope,
            url: "u".into(),
        };
        let (status, answer) = refusal(&registry_error).unwrap();
        assert_eq!(status, 401);
        assert!(answer.contains("authentication failure"), "{answer}");
        assert_eq!(
            refusal(&OciDistributionError::UnauthorizedError { url: "u".into() }),
            Some((401, String::new()))
        );
        assert_eq!(
            refusal(&OciDistributionError::ServerError {
                code: 403,
                url: "u".into(),
                message: "denied".into()
            }),
            Some((403, "denied".into()))
        );
        for other in [
            OciDistributionError::ServerError {
                code: 404,
                url: "u".into(),
                message: "x".into(),
            },
            OciDistributionError::PushNoDataError,
        ] {
            assert_eq!(refusal(&other), None, "{other}");
        }
    }

    #[test]
    fn tls_errors_are_found_behind_io_errors_and_classified() {
        let unknown = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        // How tokio-rustls hands it to hyper and reqwest.
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, unknown);
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("client error (Connect)")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let found = TlsFailure::find("r:5000", &Outer(io)).unwrap();
        assert_eq!(found.problem, TlsProblem::UnknownIssuer);
        assert_eq!(
            found.to_string(),
            "TLS with the registry r:5000 failed: invalid peer certificate: UnknownIssuer (its \
             certificate is not signed by a CA this binary trusts: the built-in roots and \
             RUNR_REGISTRY_CA_FILE)"
        );
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(TlsFailure::find("r", &refused), None);

        use rustls::CertificateError as C;
        for (err, want) in [
            (C::NotValidForName, TlsProblem::WrongName),
            (C::Expired, TlsProblem::Expired),
            (C::NotValidYet, TlsProblem::NotValidYet),
            (C::BadSignature, TlsProblem::OtherCertificate),
        ] {
            assert_eq!(problem_of(&rustls::Error::InvalidCertificate(err)), want);
        }
        assert_eq!(
            problem_of(&rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType
            )),
            TlsProblem::Handshake
        );
    }

    /// The real thing: reqwest (prewarm's requests) and oci-client (the receiver's) against
    /// `docker-registry` serving each broken certificate, and the valid one with its CA given.
    #[test]
    fn real_handshakes_are_classified_from_both_clients() {
        use runr_testkit::{TlsRegistry, TlsVariant};
        use std::time::Duration;
        if !runr_testkit::have_tool("docker-registry") || !runr_testkit::have_tool("openssl") {
            println!("skipping: docker-registry or openssl is not installed");
            return;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let with_ca = |reg: &TlsRegistry| crate::RegistryConfig {
            ca_file: Some(reg.ca_file().to_path_buf()),
            ..crate::RegistryConfig::default()
        };
        let cases = [
            (
                TlsVariant::Valid,
                false,
                TlsProblem::UnknownIssuer,
                "UnknownIssuer",
            ),
            (
                TlsVariant::WrongName,
                true,
                TlsProblem::WrongName,
                "certificate not valid for name \"127.0.0.1\"",
            ),
            (
                TlsVariant::Expired,
                true,
                TlsProblem::Expired,
                "certificate expired",
            ),
            (
                TlsVariant::NotYetValid,
                true,
                TlsProblem::NotValidYet,
                "certificate not valid yet",
            ),
        ];
        for (variant, give_ca, problem, words) in cases {
            let reg = TlsRegistry::start_variant(variant);
            let cfg = if give_ca {
                with_ca(&reg)
            } else {
                crate::RegistryConfig::default()
            };
            let http =
                crate::http::build_http_client(&cfg, Duration::from_secs(5), "runr-test").unwrap();
            let err = rt
                .block_on(http.get(format!("{}/v2/", reg.url())).send())
                .unwrap_err();
            let found = TlsFailure::find(&reg.host(), &err)
                .unwrap_or_else(|| panic!("{variant:?}: not seen as TLS: {err:?}"));
            assert_eq!(found.problem, problem, "{variant:?}: {found}");
            assert!(found.detail.contains(words), "{variant:?}: {found}");
            assert!(
                found
                    .to_string()
                    .starts_with(&format!("TLS with the registry {} failed: ", reg.host())),
                "{found}"
            );

            let oci = crate::build_client(&cfg, crate::Timeouts::default(), "runr-test").unwrap();
            let reference: Reference = format!("{}/app:1", reg.host()).parse().unwrap();
            let err = rt
                .block_on(oci.blob_exists(&reference, &format!("sha256:{}", "0".repeat(64))))
                .unwrap_err();
            assert!(!crate::is_transient(&err), "{variant:?}: retried: {err}");
            let found = rt
                .block_on(diagnose(
                    &oci,
                    &reference,
                    &RegistryAuth::Anonymous,
                    RegistryOperation::Push,
                    &err,
                ))
                .unwrap_or_else(|| panic!("{variant:?}: no diagnosis for {err}"));
            match found {
                Diagnosis::Tls(t) => assert_eq!(t.problem, problem, "{variant:?}: {t}"),
                other => panic!("{variant:?}: {other}"),
            }
        }

        // The valid certificate with its CA: no TLS failure, the registry answers.
        let reg = TlsRegistry::start();
        let http =
            crate::http::build_http_client(&with_ca(&reg), Duration::from_secs(5), "t").unwrap();
        let resp = rt
            .block_on(http.get(format!("{}/v2/", reg.url())).send())
            .unwrap();
        assert_eq!(resp.status(), 200);
    }

    /// oci-client against the real `auth: token` registry: wrong credentials are quoted from
    /// the token service (which oci-client itself drops), a pull-only user's push from the
    /// registry's own refusal.
    #[test]
    fn real_token_refusals_quote_whoever_refused() {
        use runr_testkit::token::{refusal_body, User, DETAIL_BAD_CREDENTIALS};
        use runr_testkit::TokenRegistry;
        if !runr_testkit::have_tool("docker-registry") || !runr_testkit::have_tool("openssl") {
            println!("skipping: docker-registry or openssl is not installed");
            return;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let reg = TokenRegistry::builder("runr", "s3cret")
            .user(User::with_actions("reader", "r3ad", &["pull"]))
            .start();
        let cfg = crate::RegistryConfig {
            plain_http: true,
            ..crate::RegistryConfig::default()
        };
        let client = crate::build_client(&cfg, crate::Timeouts::default(), "runr-test").unwrap();
        let reference: Reference = format!("{}/lib/app:1", reg.host()).parse().unwrap();
        let digest = format!("sha256:{}", "0".repeat(64));

        let wrong = RegistryAuth::Basic("runr".into(), "wrong".into());
        rt.block_on(client.store_auth_if_needed(reference.resolve_registry(), &wrong));
        let err = rt
            .block_on(client.blob_exists(&reference, &digest))
            .unwrap_err();
        // What oci-client alone makes of it: the registry's bare 401 to a request without token.
        assert!(err.to_string().contains("401"), "{err}");
        let found = rt
            .block_on(diagnose(
                &client,
                &reference,
                &wrong,
                RegistryOperation::Push,
                &err,
            ))
            .unwrap();
        assert_eq!(
            found.to_string(),
            format!(
                "authentication failed at the registry {} (repository lib/app, user \"runr\"): \
                 its token service answered: {}",
                reg.host(),
                refusal_body(DETAIL_BAD_CREDENTIALS).trim_end()
            )
        );

        // The right password for a user who may only pull: the token is issued, the
        // registry refuses the push scope's request.
        let reader = RegistryAuth::Basic("reader".into(), "r3ad".into());
        let client = crate::build_client(&cfg, crate::Timeouts::default(), "runr-test").unwrap();
        rt.block_on(client.store_auth_if_needed(reference.resolve_registry(), &reader));
        let err = rt
            .block_on(client.push_blob(&reference, b"x".to_vec(), &digest))
            .map(|_| ())
            .unwrap_err();
        println!("oci-client, pull-only user pushing: {err}");
        let found = rt.block_on(diagnose(
            &client,
            &reference,
            &reader,
            RegistryOperation::Push,
            &err,
        ));
        let Some(Diagnosis::Auth(auth)) = found else {
            panic!("not an auth failure: {err} -> {found:?}");
        };
        assert_eq!(
            auth.refused_by,
            RefusedBy::TokenScope { status: 401 },
            "{auth}"
        );
        assert!(
            auth.to_string().starts_with(&format!(
                "authorization failed at the registry {} (repository lib/app, user \"reader\"): \
                 the token its token service issued does not grant the access; it answered HTTP \
                 401: {{\"errors\":[{{\"code\":\"UNAUTHORIZED\"",
                reg.host()
            )),
            "{auth}"
        );
        assert!(auth.answer.contains("UNAUTHORIZED"), "{auth}");
        assert_eq!(auth.user.as_deref(), Some("reader"));
        println!("diagnosis: {auth}");
        let granted = reg.tokens().log();
        assert!(
            granted
                .iter()
                .any(|t| t.user.as_deref() == Some("reader") && t.status == 200),
            "{granted:?}"
        );
    }
}
