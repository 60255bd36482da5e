//! The Bearer-token registry against real clients: skopeo pushes and pulls through the token
//! flow, and the real registry is the judge of every token the service issues.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use runr_testkit::http::{self, Body, Conn};
use runr_testkit::httpd::percent_encode;
use runr_testkit::oci::TestImage;
use runr_testkit::token::{
    refusal_body, TokenConfig, TokenRequest, TokenService, User, BASIC_REALM,
    DETAIL_BAD_CREDENTIALS, DETAIL_BAD_GRANT, DETAIL_NO_CREDENTIALS, ISSUER, SERVICE,
};
use runr_testkit::tools::{skopeo_output, ToolOutput};
use runr_testkit::{Registry, TokenRegistry};

const USER: &str = "runr";
const PASSWORD: &str = "s3cret pass:word";

fn basic(user: &str, password: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    format!("Basic {}", b64.encode(format!("{user}:{password}")))
}

fn push(image: &TestImage, host: &str, repo: &str, args: &[&str]) -> ToolOutput {
    let dest = format!("docker://{host}/{repo}:{}", image.tag);
    let src = image.oci_ref();
    // Without it skopeo gzips the layers for a registry, and their digests change.
    let mut all = vec!["copy", "--retry-times", "0", "--preserve-digests"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[src.as_str(), dest.as_str()]);
    skopeo_output(&all)
}

fn pull(host: &str, reference: &str, args: &[&str]) -> ToolOutput {
    let out = tempfile::tempdir().unwrap();
    let src = format!("docker://{host}/{reference}");
    let dest = format!("dir:{}", out.path().display());
    let mut all = vec!["copy", "--retry-times", "0"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[src.as_str(), dest.as_str()]);
    skopeo_output(&all)
}

/// The JWT's header and claims, decoded (the signature is the registry's business).
fn jwt_parts(token: &str) -> (serde_json::Value, serde_json::Value) {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "{token}");
    let decode = |p: &str| serde_json::from_slice(&b64.decode(p).unwrap()).unwrap();
    (decode(parts[0]), decode(parts[1]))
}

fn token_get(reg: &TokenRegistry, auth: Option<&str>, scopes: &[&str]) -> http::Resp {
    let mut target = format!("/token?service={}", percent_encode(SERVICE));
    for s in scopes {
        target.push_str(&format!("&scope={}", percent_encode(s)));
    }
    let mut headers = vec![];
    if let Some(a) = auth {
        headers.push(("Authorization", a));
    }
    http::request(reg.token_addr(), "GET", &target, &headers, Body::None)
}

#[test]
fn skopeo_pushes_and_pulls_with_the_right_credentials_only() {
    let reg = TokenRegistry::start(USER, PASSWORD);
    let image = TestImage::random("1", &[20_000, 3_000]);
    let creds = format!("{USER}:{PASSWORD}");

    // The registry itself demands a token and names the realm, service and scope.
    let r = http::get(reg.addr(), "/v2/app/tags/list");
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("www-authenticate"),
        Some(
            format!(
                "Bearer realm=\"{}\",service=\"{SERVICE}\",scope=\"repository:app:pull\"",
                reg.token_url()
            )
            .as_str()
        )
    );

    let wrong = push(
        &image,
        &reg.host(),
        "app",
        &["--dest-tls-verify=false", "--dest-creds", "runr:wrong"],
    );
    assert!(!wrong.success(), "{wrong:?}");
    eprintln!("skopeo push, wrong password: {}", wrong.last_error_line());
    // skopeo quotes the errcode message, not its detail.
    assert!(
        wrong.stderr.contains(
            "unable to retrieve auth token: invalid username/password: unauthorized: authentication required"
        ),
        "{}",
        wrong.stderr
    );

    let anonymous = push(&image, &reg.host(), "app", &["--dest-tls-verify=false"]);
    assert!(!anonymous.success(), "{anonymous:?}");
    eprintln!(
        "skopeo push, no credentials: {}",
        anonymous.last_error_line()
    );
    assert!(
        anonymous
            .stderr
            .contains("unauthorized: authentication required"),
        "{}",
        anonymous.stderr
    );

    let ok = push(
        &image,
        &reg.host(),
        "app",
        &["--dest-tls-verify=false", "--dest-creds", &creds],
    );
    assert!(ok.success(), "{ok:?}\n{}", reg.log());
    for blob in image.blobs() {
        let stored = runr_testkit::stored_blob(&reg.storage(), &blob.digest);
        assert_eq!(std::fs::read(stored).unwrap(), blob.data);
    }

    let back = pull(
        &reg.host(),
        "app:1",
        &["--src-tls-verify=false", "--src-creds", &creds],
    );
    assert!(back.success(), "{back:?}");
    let bad_pull = pull(
        &reg.host(),
        "app:1",
        &["--src-tls-verify=false", "--src-creds", "nobody:x"],
    );
    assert!(!bad_pull.success());
    eprintln!("skopeo pull, unknown user: {}", bad_pull.last_error_line());

    let log = reg.tokens().log();
    assert_eq!(log.len() as u64, reg.token_requests());
    assert!(log.iter().any(|e| e.status == 200
        && e.user.as_deref() == Some(USER)
        && e.granted.iter().any(|g| g == "repository:app:pull,push")));
    let refused: Vec<&TokenRequest> = log.iter().filter(|e| e.status == 401).collect();
    assert!(refused.iter().any(|e| e.user.as_deref() == Some("runr")));
    assert!(refused.iter().any(|e| e.user.is_none()));
    assert!(refused.iter().any(|e| e.user.as_deref() == Some("nobody")));
    assert_eq!(
        reg.tokens().refused(),
        refused.len() as u64,
        "every refusal is in the log"
    );
}

/// Many clients at once, right, wrong and missing credentials mixed: every refusal is the exact
/// bytes distribution's token server sends, every token is accepted by the real registry for
/// what it grants, and only that.
#[test]
fn concurrent_token_requests_get_exact_answers() {
    let reg = Arc::new(TokenRegistry::start(USER, PASSWORD));
    let image = TestImage::random("1", &[1_000]);
    let creds = format!("{USER}:{PASSWORD}");
    let ok = push(
        &image,
        &reg.host(),
        "team/app",
        &["--dest-tls-verify=false", "--dest-creds", &creds],
    );
    assert!(ok.success(), "{ok:?}");
    let before = reg.token_requests();

    const THREADS: usize = 24;
    const ROUNDS: usize = 8;
    let right = basic(USER, PASSWORD);
    let wrong = basic(USER, "nope");
    let stranger = basic("stranger", PASSWORD);
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let reg = Arc::clone(&reg);
            let (right, wrong, stranger) = (right.clone(), wrong.clone(), stranger.clone());
            std::thread::spawn(move || {
                // One keep-alive connection per thread, as real clients pool them.
                let mut token_conn = Conn::open(reg.token_addr());
                let mut registry_conn = Conn::open(reg.addr());
                for round in 0..ROUNDS {
                    let (auth, expect_ok) = match (t + round) % 4 {
                        0 | 1 => (Some(right.as_str()), true),
                        2 => (Some(wrong.as_str()), false),
                        _ => (
                            if round % 2 == 0 {
                                Some(stranger.as_str())
                            } else {
                                None
                            },
                            false,
                        ),
                    };
                    let target = format!(
                        "/token?service={SERVICE}&scope={}&account={USER}",
                        percent_encode("repository:team/app:pull")
                    );
                    let mut headers = vec![("Host", "token")];
                    if let Some(a) = auth {
                        headers.push(("Authorization", a));
                    }
                    let r = token_conn.send("GET", &target, &headers, Body::None);
                    if !expect_ok {
                        let detail = if auth.is_some() {
                            DETAIL_BAD_CREDENTIALS
                        } else {
                            DETAIL_NO_CREDENTIALS
                        };
                        let body = refusal_body(detail);
                        assert_eq!(
                            r.headers,
                            vec![
                                (
                                    "Content-Type".to_string(),
                                    "application/json; charset=utf-8".to_string()
                                ),
                                (
                                    "Www-Authenticate".to_string(),
                                    format!("Basic realm=\"{BASIC_REALM}\"")
                                ),
                                ("Content-Length".to_string(), body.len().to_string()),
                            ]
                        );
                        assert_eq!((r.status, r.text()), (401, body));
                        continue;
                    }
                    assert_eq!(r.status, 200, "{}", r.text());
                    assert_eq!(r.header("content-type"), Some("application/json"));
                    assert_eq!(
                        r.header("content-length"),
                        Some(r.body.len().to_string().as_str())
                    );
                    assert!(r.body.ends_with(b"}\n"));
                    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                    let obj = v.as_object().unwrap();
                    let keys: Vec<&String> = obj.keys().collect();
                    assert_eq!(
                        keys,
                        ["access_token", "expires_in", "issued_at", "token"],
                        "{v}"
                    );
                    let token = v["token"].as_str().unwrap();
                    assert_eq!(v["access_token"], token);
                    assert_eq!(v["expires_in"], 900);
                    let issued = v["issued_at"].as_str().unwrap();
                    assert!(
                        issued.len() == 20 && issued.ends_with('Z') && issued.as_bytes()[10] == b'T',
                        "{issued}"
                    );
                    let (header, claims) = jwt_parts(token);
                    assert_eq!(
                        header,
                        serde_json::json!({"typ": "JWT", "alg": "ES256", "kid": reg.tokens().key_id()})
                    );
                    assert_eq!(claims["iss"], ISSUER);
                    assert_eq!(claims["sub"], USER);
                    assert_eq!(claims["aud"], SERVICE);
                    assert_eq!(
                        claims["access"],
                        serde_json::json!([{"type": "repository", "name": "team/app", "actions": ["pull"]}])
                    );
                    let exp = claims["exp"].as_i64().unwrap();
                    let nbf = claims["nbf"].as_i64().unwrap();
                    assert_eq!(exp - nbf, 900);
                    assert_eq!(claims["iat"], claims["nbf"]);
                    // The real judge: the registry accepts it for the granted scope...
                    let bearer = format!("Bearer {token}");
                    let tags = registry_conn.send(
                        "GET",
                        "/v2/team/app/tags/list",
                        &[("Authorization", &bearer)],
                        Body::None,
                    );
                    assert_eq!(
                        (tags.status, tags.text()),
                        (200, "{\"name\":\"team/app\",\"tags\":[\"1\"]}\n".to_string())
                    );
                    // ...and not for another repository.
                    let other = registry_conn.send(
                        "GET",
                        "/v2/other/tags/list",
                        &[("Authorization", &bearer)],
                        Body::None,
                    );
                    assert_eq!(other.status, 401);
                    assert_eq!(
                        other.header("www-authenticate"),
                        Some(
                            format!(
                                "Bearer realm=\"{}\",service=\"{SERVICE}\",scope=\"repository:other:pull\",error=\"insufficient_scope\"",
                                reg.token_url()
                            )
                            .as_str()
                        )
                    );
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let answered = reg.token_requests() - before;
    assert_eq!(answered, (THREADS * ROUNDS) as u64);
    let expected_ok = (0..THREADS)
        .flat_map(|t| (0..ROUNDS).map(move |r| (t + r) % 4))
        .filter(|k| *k < 2)
        .count();
    let log = reg.tokens().log();
    let issued = log[before as usize..]
        .iter()
        .filter(|e| e.status == 200)
        .count();
    assert_eq!(issued, expected_ok);
}

/// A tampered signature, another issuer's key or an expired token: the registry refuses them
/// all with `invalid_token`, so it really checks what the service signs.
#[test]
fn the_registry_checks_the_signature() {
    let reg = TokenRegistry::start(USER, PASSWORD);
    let r = token_get(&reg, Some(&basic(USER, PASSWORD)), &["repository:app:pull"]);
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let token = v["token"].as_str().unwrap().to_string();
    let with = |t: &str| {
        http::request(
            reg.addr(),
            "GET",
            "/v2/app/tags/list",
            &[("Authorization", &format!("Bearer {t}"))],
            Body::None,
        )
    };
    // Accepted (the repository does not exist: 404, not 401).
    let good = with(&token);
    assert_eq!(good.status, 404, "{}", good.text());
    assert!(good.text().contains("NAME_UNKNOWN"));

    let mut tampered = token.clone().into_bytes();
    let last = tampered.len() - 5;
    tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    // A token from another service (another key) of the same shape.
    let other = TokenRegistry::start(USER, PASSWORD);
    let r = token_get(
        &other,
        Some(&basic(USER, PASSWORD)),
        &["repository:app:pull"],
    );
    let foreign: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    for (what, t) in [
        ("tampered", tampered.as_str()),
        ("foreign key", foreign["token"].as_str().unwrap()),
    ] {
        let r = with(t);
        assert_eq!(r.status, 401, "{what}");
        assert!(
            r.header("www-authenticate")
                .unwrap()
                .ends_with(",error=\"invalid_token\""),
            "{what}: {:?}",
            r.headers
        );
    }
}

#[test]
fn a_pull_only_user_cannot_push() {
    let reg = TokenRegistry::builder(USER, PASSWORD)
        .user(User::with_actions("reader", "r", &["pull"]))
        .start();
    let image = TestImage::random("1", &[1_000]);
    let creds = format!("{USER}:{PASSWORD}");
    assert!(push(
        &image,
        &reg.host(),
        "app",
        &["--dest-tls-verify=false", "--dest-creds", &creds]
    )
    .success());
    let denied = push(
        &image,
        &reg.host(),
        "app2",
        &["--dest-tls-verify=false", "--dest-creds", "reader:r"],
    );
    assert!(!denied.success());
    eprintln!("skopeo push, pull-only user: {}", denied.last_error_line());
    assert!(
        denied.stderr.contains("authentication required"),
        "{}",
        denied.stderr
    );
    let read = pull(
        &reg.host(),
        "app:1",
        &["--src-tls-verify=false", "--src-creds", "reader:r"],
    );
    assert!(read.success(), "{read:?}");
    let log = reg.tokens().log();
    assert!(log.iter().any(|e| e.user.as_deref() == Some("reader")
        && e.status == 200
        && e.scopes.iter().any(|s| s.contains("push"))
        && e.granted == ["repository:app2:pull"]));
}

#[test]
fn anonymous_pulls_when_allowed() {
    let reg = TokenRegistry::builder(USER, PASSWORD)
        .anonymous(&["pull"])
        .start();
    let image = TestImage::random("1", &[1_000]);
    let creds = format!("{USER}:{PASSWORD}");
    assert!(push(
        &image,
        &reg.host(),
        "app",
        &["--dest-tls-verify=false", "--dest-creds", &creds]
    )
    .success());
    let anon = pull(&reg.host(), "app:1", &["--src-tls-verify=false"]);
    assert!(anon.success(), "{anon:?}");
    let anon_push = push(&image, &reg.host(), "app3", &["--dest-tls-verify=false"]);
    assert!(!anon_push.success());
    // The anonymous token grants pull only, to the empty subject.
    let r = token_get(&reg, None, &["repository:app:pull,push"]);
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let (_, claims) = jwt_parts(v["token"].as_str().unwrap());
    assert_eq!(claims["sub"], "");
    assert_eq!(
        claims["access"],
        serde_json::json!([{"type": "repository", "name": "app", "actions": ["pull"]}])
    );
}

/// The OAuth2 password grant (containerd tries it first), with distribution's answers.
#[test]
fn oauth2_password_grant() {
    let reg = TokenRegistry::start(USER, PASSWORD);
    let post = |form: &str| {
        http::request(
            reg.token_addr(),
            "POST",
            "/token",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            Body::Sized(form.as_bytes()),
        )
    };
    let form = format!(
        "grant_type=password&service={SERVICE}&client_id=containerd&username={USER}&password={}&scope={}",
        percent_encode(PASSWORD),
        percent_encode("repository:app:pull repository:lib/base:pull,push")
    );
    let r = post(&form);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        v.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["access_token", "expires_in", "issued_at", "scope"]
    );
    assert_eq!(
        v["scope"],
        "repository:app:pull repository:lib/base:pull,push"
    );
    let (_, claims) = jwt_parts(v["access_token"].as_str().unwrap());
    assert_eq!(claims["access"].as_array().unwrap().len(), 2);
    let good = http::request(
        reg.addr(),
        "GET",
        "/v2/lib/base/tags/list",
        &[(
            "Authorization",
            &format!("Bearer {}", v["access_token"].as_str().unwrap()),
        )],
        Body::None,
    );
    assert_eq!(good.status, 404, "accepted, repository unknown");

    let wrong = post(&form.replace(&percent_encode(PASSWORD), "x"));
    assert_eq!(
        (wrong.status, wrong.text()),
        (401, refusal_body(DETAIL_BAD_GRANT))
    );
    assert_eq!(wrong.header("www-authenticate"), None);
    let cases: BTreeMap<&str, &str> = [
        (
            "service=s&client_id=c",
            "{\"errors\":[{\"code\":\"MISSING_REQUIRED_FIELD\",\"message\":\"missing required field\",\"detail\":\"missing grant_type value\"}]}\n",
        ),
        (
            "grant_type=password&client_id=c",
            "{\"errors\":[{\"code\":\"MISSING_REQUIRED_FIELD\",\"message\":\"missing required field\",\"detail\":\"missing service value\"}]}\n",
        ),
        (
            "grant_type=password&service=s",
            "{\"errors\":[{\"code\":\"MISSING_REQUIRED_FIELD\",\"message\":\"missing required field\",\"detail\":\"missing client_id value\"}]}\n",
        ),
        (
            "grant_type=password&service=s&client_id=c&password=p",
            "{\"errors\":[{\"code\":\"UNSUPPORTED_VALUE\",\"message\":\"unsupported value\",\"detail\":\"missing username value\"}]}\n",
        ),
        (
            "grant_type=password&service=s&client_id=c&username=u",
            "{\"errors\":[{\"code\":\"UNSUPPORTED_VALUE\",\"message\":\"unsupported value\",\"detail\":\"missing password value\"}]}\n",
        ),
        (
            "grant_type=magic&service=s&client_id=c",
            "{\"errors\":[{\"code\":\"UNSUPPORTED_VALUE\",\"message\":\"unsupported value\",\"detail\":\"unknown grant_type value\"}]}\n",
        ),
    ]
    .into_iter()
    .collect();
    for (form, body) in cases {
        let r = post(form);
        assert_eq!((r.status, r.text().as_str()), (400, body), "{form}");
        assert_eq!(
            r.header("content-type"),
            Some("application/json; charset=utf-8")
        );
    }
    let refresh = post("grant_type=refresh_token&service=s&client_id=c&refresh_token=abc");
    assert_eq!(
        (refresh.status, refresh.text()),
        (401, refusal_body("invalid refresh token"))
    );
    // Other methods and paths.
    let put = http::request(reg.token_addr(), "PUT", "/token", &[], Body::None);
    assert_eq!(put.status, 405);
    assert_eq!(put.header("allow"), Some("GET, POST"));
    assert_eq!(http::get(reg.token_addr(), "/other").status, 404);
}

/// distribution 2.8 applies `auth: token` to a pull-through cache's own clients.
#[test]
fn a_token_protected_pull_through_cache() {
    let upstream = Registry::start();
    let image = TestImage::random("1", &[30_000]);
    assert!(push(
        &image,
        &upstream.host(),
        "lib/app",
        &["--dest-tls-verify=false"]
    )
    .success());
    let cache = TokenRegistry::start_proxy(&upstream.url(), USER, PASSWORD);
    let creds = format!("{USER}:{PASSWORD}");
    let anon = pull(&cache.host(), "lib/app:1", &["--src-tls-verify=false"]);
    assert!(!anon.success());
    assert!(
        anon.stderr.contains("authentication required"),
        "{}",
        anon.stderr
    );
    let wrong = pull(
        &cache.host(),
        "lib/app:1",
        &["--src-tls-verify=false", "--src-creds", "runr:bad"],
    );
    assert!(!wrong.success());
    assert!(
        wrong.stderr.contains("invalid username/password"),
        "{}",
        wrong.stderr
    );
    let ok = pull(
        &cache.host(),
        "lib/app:1",
        &["--src-tls-verify=false", "--src-creds", &creds],
    );
    assert!(ok.success(), "{ok:?}\n{}", cache.log());
    // Served from upstream through the cache, and now held by it.
    let held = runr_testkit::stored_blob(&cache.storage(), &image.layers[0].digest);
    runr_testkit::wait_for(
        "the cache to store the layer",
        std::time::Duration::from_secs(30),
        || (std::fs::read(&held).ok()? == image.layers[0].data).then_some(()),
    );
    // A cache refuses pushes even with a token that grants them.
    let pushed = push(
        &image,
        &cache.host(),
        "lib/app",
        &["--dest-tls-verify=false", "--dest-creds", &creds],
    );
    assert!(!pushed.success());
}

#[test]
fn token_service_and_registry_stop_and_restart() {
    let mut reg = TokenRegistry::start(USER, PASSWORD);
    let image = TestImage::random("1", &[1_000]);
    let creds = format!("{USER}:{PASSWORD}");
    let args = ["--dest-tls-verify=false", "--dest-creds", creds.as_str()];
    reg.stop_token_service();
    assert!(!reg.tokens().is_running());
    // The registry still challenges; the realm refuses connections.
    assert_eq!(runr_testkit::http_get_status(reg.addr(), "/v2/"), Some(401));
    assert!(runr_testkit::nothing_listens(reg.token_addr()));
    let down = push(&image, &reg.host(), "app", &args);
    assert!(!down.success());
    eprintln!(
        "skopeo push, token service down: {}",
        down.last_error_line()
    );
    assert!(
        down.stderr.contains("connection refused"),
        "{}",
        down.stderr
    );
    reg.restart_token_service();
    assert!(push(&image, &reg.host(), "app", &args).success());

    reg.stop();
    assert_eq!(runr_testkit::http_get_status(reg.addr(), "/v2/"), None);
    reg.restart();
    let back = pull(
        &reg.host(),
        "app:1",
        &["--src-tls-verify=false", "--src-creds", &creds],
    );
    assert!(
        back.success(),
        "storage and key survive a restart: {back:?}"
    );
    reg.stop_registry();
    assert_eq!(runr_testkit::http_get_status(reg.addr(), "/v2/"), None);
    reg.restart_registry();
    assert_eq!(runr_testkit::http_get_status(reg.addr(), "/v2/"), Some(401));
}

#[test]
fn a_token_registry_over_tls() {
    let reg = TokenRegistry::builder(USER, PASSWORD).tls().start();
    assert!(reg.url().starts_with("https://"));
    let ca = reg.ca().expect("a CA");
    let image = TestImage::random("1", &[1_000]);
    let creds = format!("{USER}:{PASSWORD}");
    let cert_dir = ca.cert_dir().display().to_string();
    let ok = push(
        &image,
        &reg.host(),
        "app",
        &["--dest-cert-dir", &cert_dir, "--dest-creds", &creds],
    );
    assert!(ok.success(), "{ok:?}");
    let wrong = push(
        &image,
        &reg.host(),
        "app",
        &["--dest-cert-dir", &cert_dir, "--dest-creds", "runr:x"],
    );
    assert!(!wrong.success());
    assert!(
        wrong.stderr.contains("invalid username/password"),
        "{}",
        wrong.stderr
    );
    assert_eq!(reg.tokens().log().last().map(|e| e.status), Some(401));
}

/// The log keeps the first `log_limit` requests; the counters count every one.
#[test]
fn the_token_log_is_bounded_and_the_counters_are_not() {
    let mut config = TokenConfig::single(USER, PASSWORD);
    config.log_limit = 3;
    let service = TokenService::start(config);
    assert_eq!(service.url(), format!("http://{}/token", service.addr()));
    let right = basic(USER, PASSWORD);
    let wrong = basic(USER, "x");
    for i in 0..5 {
        let auth = if i % 2 == 0 { &right } else { &wrong };
        let r = http::request(
            service.addr(),
            "GET",
            &format!("/token?service={SERVICE}&scope=repository:r{i}:pull"),
            &[("Authorization", auth)],
            Body::None,
        );
        assert_eq!(r.status, if i % 2 == 0 { 200 } else { 401 });
    }
    assert_eq!(
        (service.requests(), service.issued(), service.refused()),
        (5, 3, 2)
    );
    let log = service.log();
    assert_eq!(
        log.iter()
            .map(|e| (e.status, e.scopes.clone()))
            .collect::<Vec<_>>(),
        vec![
            (200, vec!["repository:r0:pull".to_string()]),
            (401, vec!["repository:r1:pull".to_string()]),
            (200, vec!["repository:r2:pull".to_string()]),
        ]
    );
    assert_eq!(log[0].granted, ["repository:r0:pull"]);
    assert!(log[1].granted.is_empty());
    // The signing certificate is what a registry's rootcertbundle takes.
    let pem = std::fs::read_to_string(service.signer_cert()).unwrap();
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
}
