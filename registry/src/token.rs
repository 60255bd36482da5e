//! The distribution token flow (<https://distribution.github.io/distribution/spec/auth/token/>)
//! done once, with every answer's status seen, for callers that share one grant across many
//! requests.
//!
//! oci-client runs the flow by itself before each request that finds no token in its cache, and
//! folds every answer of the token service other than 200 into one error that it then drops (the
//! request goes out without a token). A push of N blobs in parallel therefore asks the token
//! service N times when the credentials are wrong, and a refusal (401, 403) cannot be told from
//! an outage (502, 503, connection refused). [`exchange`] asks once and says which it was:
//! [`TokenError::Refused`] is final, [`TokenError::Transient`] is worth another attempt.

use std::time::Duration;

use crate::config::RegistryConfig;
use crate::failure::{AuthFailure, RefusedBy, TlsFailure};
use crate::http::base_url;
use crate::retry::is_transient_status;

/// Bytes of a token service's answer read at most: a token is a few KiB; anything longer is not
/// an answer of a token service.
const ANSWER_LIMIT: usize = 64 * 1024;

/// How long a token lives when its answer does not say (the token specification's default).
pub const DEFAULT_EXPIRES_IN: Duration = Duration::from_secs(60);

/// What requests to the registry carry once the flow is done.
#[derive(Clone, PartialEq, Eq)]
pub enum Grant {
    /// A Bearer token issued by the token service the registry's challenge named.
    Bearer {
        /// The token.
        token: String,
        /// How long it lives from its issue (`expires_in`, else [`DEFAULT_EXPIRES_IN`]): a
        /// caller whose requests outlast it asks again before then.
        expires_in: Duration,
    },
    /// The registry challenges for Basic credentials, which [`RegistryConfig`] has.
    Basic,
    /// Nothing: the registry asks for no credentials, or challenges for Basic ones and none are
    /// configured (the registry's own 401 then says so, on the first request).
    Anonymous,
}

impl std::fmt::Debug for Grant {
    // A token is a credential: it never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Grant::Bearer { expires_in, .. } => {
                write!(f, "Bearer(<redacted>, expires in {expires_in:?})")
            }
            Grant::Basic => f.write_str("Basic"),
            Grant::Anonymous => f.write_str("Anonymous"),
        }
    }
}

/// Why no grant could be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TokenError {
    /// The token service refused the credentials (or their absence): final, quoting its answer.
    #[error("{0}")]
    Refused(AuthFailure),
    /// The TLS handshake with the registry or the token service failed: final.
    #[error("{0}")]
    Tls(TlsFailure),
    /// No answer, or one worth waiting out (5xx, 429, 408): another attempt may succeed.
    #[error("{what}: {message}")]
    Transient {
        /// What was asked (`GET http://…/v2/`, `the token service http://…/token`).
        what: String,
        /// The connection error or the status and the start of the answer.
        message: String,
    },
    /// An answer that makes no sense (a challenge without a realm, a token answer without a
    /// token, another 4xx of the token service): final.
    #[error("{what}: {message}")]
    Failed {
        /// What was asked.
        what: String,
        /// What was wrong with the answer.
        message: String,
    },
}

impl TokenError {
    /// True when another attempt may cure it.
    pub fn is_transient(&self) -> bool {
        matches!(self, TokenError::Transient { .. })
    }
}

/// The grant for `actions` (`pull`, `pull,push`) on `repository` at `registry` (`host[:port]`):
/// `GET /v2/` for the challenge, then, for a Bearer challenge, one request to its realm with the
/// configured Basic credentials (none when unset). `timeout` bounds each of the two requests.
pub async fn exchange(
    http: &reqwest::Client,
    cfg: &RegistryConfig,
    registry: &str,
    repository: &str,
    actions: &str,
    timeout: Duration,
) -> Result<Grant, TokenError> {
    let probe = format!("{}/v2/", base_url(cfg, registry));
    let what = format!("GET {probe}");
    let resp = http
        .get(&probe)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| connect_error(registry, &what, &e))?;
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get(reqwest::header::WWW_AUTHENTICATE)
        .and_then(|v| v.to_str().ok())
        .map(parse_challenge);
    if is_transient_status(status) {
        return Err(TokenError::Transient {
            what,
            message: format!("HTTP {status}"),
        });
    }
    let Some(challenge) = challenge else {
        // No challenge: oci-client sends its requests without credentials then, and so do we.
        return Ok(Grant::Anonymous);
    };
    let (realm, service) = match challenge {
        Challenge::Bearer { realm, service } => (realm, service),
        Challenge::Basic if cfg.credentials.is_some() => return Ok(Grant::Basic),
        Challenge::Basic | Challenge::Other => return Ok(Grant::Anonymous),
        Challenge::BearerWithoutRealm => {
            return Err(TokenError::Failed {
                what,
                message: "its Bearer challenge names no realm".into(),
            })
        }
    };
    // Built before any await: the serializer is not `Send`.
    let url = {
        let scope = format!("repository:{repository}:{actions}");
        let mut query = form_urlencoded::Serializer::new(String::new());
        query.append_pair("scope", &scope);
        if let Some(service) = &service {
            query.append_pair("service", service);
        }
        let sep = if realm.contains('?') { '&' } else { '?' };
        format!("{realm}{sep}{}", query.finish())
    };
    let what = format!("the token service {realm}");
    let mut req = http.get(&url).timeout(timeout);
    if let Some((user, password)) = &cfg.credentials {
        req = req.basic_auth(user, Some(password));
    }
    let mut resp = req
        .send()
        .await
        .map_err(|e| connect_error(registry, &what, &e))?;
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                let room = ANSWER_LIMIT - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if body.len() == ANSWER_LIMIT {
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => return Err(connect_error(registry, &what, &e)),
        }
    }
    let auth = cfg.auth();
    match status {
        200 => match token_of(&body) {
            Some(token) => Ok(Grant::Bearer {
                token,
                expires_in: expires_in_of(&body).unwrap_or(DEFAULT_EXPIRES_IN),
            }),
            None => Err(TokenError::Failed {
                what,
                message: "its answer holds no token (neither \"token\" nor \"access_token\")"
                    .into(),
            }),
        },
        s if is_transient_status(s) => Err(TokenError::Transient {
            what,
            message: format!("HTTP {s}: {}", crate::failure::quote_answer(&body)),
        }),
        // distribution's token server answers 401 to wrong or missing credentials; others
        // answer 403, and 400 to a request they cannot read (a malformed scope): each is that
        // service's final word on this request.
        _ => Err(TokenError::Refused(AuthFailure::new(
            registry,
            repository,
            &auth,
            RefusedBy::TokenService,
            &body,
        ))),
    }
}

/// A request that got no answer: a TLS failure (configuration) or a connection problem (worth
/// another attempt).
fn connect_error(registry: &str, what: &str, e: &reqwest::Error) -> TokenError {
    match TlsFailure::find(registry, e) {
        Some(tls) => TokenError::Tls(tls),
        None => TokenError::Transient {
            what: what.to_string(),
            message: runr_base::fmt::error_chain(e),
        },
    }
}

/// What the registry's `WWW-Authenticate` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Challenge {
    Bearer {
        realm: String,
        service: Option<String>,
    },
    BearerWithoutRealm,
    Basic,
    Other,
}

/// The first Bearer challenge of a `WWW-Authenticate` value (a header may list several), else
/// Basic when one is offered.
fn parse_challenge(value: &str) -> Challenge {
    let mut found = Challenge::Other;
    for challenge in http_auth::ChallengeParser::new(value).flatten() {
        if challenge.scheme.eq_ignore_ascii_case("bearer") {
            let param = |name: &str| {
                challenge
                    .params
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.to_unescaped())
            };
            return match param("realm") {
                Some(realm) => Challenge::Bearer {
                    realm,
                    service: param("service"),
                },
                None => Challenge::BearerWithoutRealm,
            };
        }
        if challenge.scheme.eq_ignore_ascii_case("basic") {
            found = Challenge::Basic;
        }
    }
    found
}

/// `token`, else `access_token`, of a token answer (the specification allows either; Docker Hub
/// and distribution send both).
fn token_of(body: &[u8]) -> Option<String> {
    let answer: serde_json::Value = serde_json::from_slice(body).ok()?;
    ["token", "access_token"].iter().find_map(|k| {
        answer[k]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_string)
    })
}

/// `expires_in` of a token answer, in seconds; `None` when absent or not a positive number.
fn expires_in_of(body: &[u8]) -> Option<Duration> {
    let answer: serde_json::Value = serde_json::from_slice(body).ok()?;
    let secs = answer["expires_in"].as_u64().filter(|s| *s > 0)?;
    Some(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="http://127.0.0.1:1/token",service="runr-test-registry",scope="repository:a:pull""#
            ),
            Challenge::Bearer {
                realm: "http://127.0.0.1:1/token".into(),
                service: Some("runr-test-registry".into()),
            }
        );
        // Several challenges in one header; scheme and names in any case; quoted escapes.
        assert_eq!(
            parse_challenge(r#"Basic realm="x", BEARER REALM="https://a/t\"x", Service=s"#),
            Challenge::Bearer {
                realm: "https://a/t\"x".into(),
                service: Some("s".into()),
            }
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="runr-test""#),
            Challenge::Basic
        );
        assert_eq!(
            parse_challenge(r#"Bearer service="s""#),
            Challenge::BearerWithoutRealm
        );
        assert_eq!(parse_challenge("Negotiate"), Challenge::Other);
        assert_eq!(parse_challenge("\"garbage"), Challenge::Other);
    }

    #[test]
    fn tokens() {
        assert_eq!(
            token_of(br#"{"token":"a","access_token":"b"}"#),
            Some("a".into())
        );
        assert_eq!(token_of(br#"{"access_token":"b"}"#), Some("b".into()));
        assert_eq!(
            token_of(br#"{"token":"","access_token":"b"}"#),
            Some("b".into())
        );
        assert_eq!(token_of(br#"{"token":7}"#), None);
        assert_eq!(token_of(b"not json"), None);
        let grant = Grant::Bearer {
            token: "s3cret".into(),
            expires_in: DEFAULT_EXPIRES_IN,
        };
        assert_eq!(format!("{grant:?}"), "Bearer(<redacted>, expires in 60s)");
        assert_eq!(
            expires_in_of(br#"{"token":"a","expires_in":900}"#),
            Some(Duration::from_secs(900))
        );
        for no in [
            &br#"{"token":"a"}"#[..],
            br#"{"expires_in":0}"#,
            br#"{"expires_in":"9"}"#,
        ] {
            assert_eq!(expires_in_of(no), None);
        }
    }

    /// Against the real `auth: token` registry: one token request per exchange, a refusal told
    /// from an outage of the token service, and the registry's own Basic and no-auth answers.
    #[test]
    fn real_registries_one_request_per_exchange() {
        use runr_testkit::token::{refusal_body, DETAIL_BAD_CREDENTIALS};
        use runr_testkit::{Registry, TokenRegistry};
        if !["docker-registry", "openssl", "htpasswd"]
            .iter()
            .all(|t| runr_testkit::have_tool(t))
        {
            println!("skipping: docker-registry, openssl or htpasswd is not installed");
            return;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let cfg = |creds: Option<(&str, &str)>| RegistryConfig {
            plain_http: true,
            credentials: creds.map(|(u, p)| (u.to_string(), p.to_string())),
            ..RegistryConfig::default()
        };
        let http = crate::http::build_http_client(&cfg(None), Duration::from_secs(5), "t").unwrap();
        let limit = Duration::from_secs(30);
        let mut reg = TokenRegistry::start("runr", "s3cret pass:word");
        let host = reg.host();
        let run = |c: &RegistryConfig| {
            rt.block_on(exchange(&http, c, &host, "lib/app", "pull,push", limit))
        };

        let grant = run(&cfg(Some(("runr", "s3cret pass:word")))).unwrap();
        // The testkit's token service answers distribution's 15 minutes.
        assert!(
            matches!(grant, Grant::Bearer { expires_in, .. } if expires_in == runr_testkit::token::DEFAULT_TTL),
            "{grant:?}"
        );
        assert_eq!(reg.token_requests(), 1);
        let log = reg.tokens().log();
        assert_eq!(log[0].scopes, ["repository:lib/app:pull,push"], "{log:?}");
        assert_eq!(log[0].status, 200, "{log:?}");

        let Err(TokenError::Refused(refusal)) = run(&cfg(Some(("runr", "wrong")))) else {
            panic!("a wrong password must be refused");
        };
        assert_eq!(refusal.refused_by, RefusedBy::TokenService);
        assert_eq!(
            refusal.to_string(),
            format!(
                "authentication failed at the registry {host} (repository lib/app, user \
                 \"runr\"): its token service answered: {}",
                refusal_body(DETAIL_BAD_CREDENTIALS).trim_end()
            )
        );
        assert_eq!(reg.token_requests(), 2, "one request for the refusal");

        // The token service is down: an outage, worth another attempt, not a refusal.
        reg.stop_token_service();
        let err = run(&cfg(Some(("runr", "wrong")))).unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(
            err.to_string().starts_with("the token service http://"),
            "{err}"
        );
        reg.restart_token_service();
        assert!(matches!(
            run(&cfg(Some(("runr", "s3cret pass:word")))),
            Ok(Grant::Bearer { .. })
        ));

        // Basic auth at the registry itself, and no auth at all.
        let basic = Registry::start_with_basic_auth("runr", "s3cret");
        let b = basic.host();
        let once = |c: &RegistryConfig, host: &str| {
            rt.block_on(exchange(&http, c, host, "lib/app", "pull", limit))
        };
        assert_eq!(once(&cfg(Some(("runr", "x"))), &b).unwrap(), Grant::Basic);
        assert_eq!(once(&cfg(None), &b).unwrap(), Grant::Anonymous);
        let open = Registry::start();
        assert_eq!(once(&cfg(None), &open.host()).unwrap(), Grant::Anonymous);
        // Nothing listens: transient.
        let mut gone = Registry::start();
        let g = gone.host();
        gone.stop();
        assert!(once(&cfg(None), &g).unwrap_err().is_transient());
    }
}
