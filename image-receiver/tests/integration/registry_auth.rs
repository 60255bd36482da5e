//! The region registry behind Bearer-token auth (distribution's `auth: token`, with a token
//! service answering as distribution's own does) and behind TLS, through the real binary: the
//! push works with the right credentials (skopeo pulls it back through the token flow), and a
//! refusal or a certificate problem says what it is first, quoting whoever refused.

use std::path::Path;
use std::time::{Duration, Instant};

use runr_testkit::oci::TestImage;
use runr_testkit::token::{refusal_body, User, DETAIL_BAD_CREDENTIALS, DETAIL_NO_CREDENTIALS};
use runr_testkit::tools::skopeo_output;
use runr_testkit::{TlsRegistry, TokenRegistry};
use serde_json::Value;

use crate::support::{oci_archive, pulled_whole, Receiver};

const USER: &str = "runr";
/// A blank and a colon: the password must reach the token service as it is.
const PASSWORD: &str = "s3cret pass:word";
const REPO: &str = "runr-uploads/platform/app";

fn tools() -> bool {
    runr_testkit::tools_present(&["docker-registry", "skopeo", "openssl"])
}

/// Uploads `data` to a new receiver pushing to `target` with `env`, and waits for the end.
fn upload(work: &Path, data: &[u8], target: &str, env: &[(&str, &str)]) -> (Value, Receiver) {
    let dir = work.join("upload");
    std::fs::create_dir(&dir).unwrap();
    let mut all = vec![
        ("RUNR_UPLOAD_TARGET", target),
        ("RUNR_UPLOAD_FILENAME", "app.tar"),
    ];
    all.extend_from_slice(env);
    let r = Receiver::for_data(&dir, data, &all);
    assert_eq!(r.put(0, data).0, 200);
    assert_eq!(r.complete().0, 202);
    let s = r.finished();
    (s, r)
}

#[test]
fn a_token_protected_registry_takes_the_push_and_skopeo_pulls_it() {
    if !tools() {
        return;
    }
    let reg = TokenRegistry::start(USER, PASSWORD);
    let image = TestImage::random("1", &[300_000, 20_000]);
    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    let target = format!("{}/{REPO}:1", reg.host());
    let (s, r) = upload(
        work.path(),
        &data,
        &target,
        &[
            ("RUNR_REGISTRY_USERNAME", USER),
            ("RUNR_REGISTRY_PASSWORD", PASSWORD),
        ],
    );
    assert_eq!(s["status"], "completed", "{s}\n{}\n{}", r.log(), reg.log());
    assert_eq!(s["image"]["tag_ref"], target.as_str(), "{s}");
    assert_eq!(s["image"]["digest"], image.manifest.digest.as_str(), "{s}");
    let log = reg.tokens().log();
    assert!(
        log.iter().any(|t| t.status == 200
            && t.user.as_deref() == Some(USER)
            && t.granted
                .iter()
                .any(|g| g == &format!("repository:{REPO}:pull,push"))),
        "no push token was issued: {log:?}"
    );
    assert_eq!(reg.tokens().refused(), 0, "{log:?}");
    let creds = format!("{USER}:{PASSWORD}");
    pulled_whole(
        &target,
        &image,
        &["--src-tls-verify=false", "--src-creds", &creds],
    );
}

#[test]
fn a_refused_push_says_so_first_quoting_the_token_service_or_the_registry() {
    if !tools() {
        return;
    }
    let reg = TokenRegistry::builder(USER, PASSWORD)
        .user(User::with_actions("reader", "r3ad", &["pull"]))
        .start();
    let image = TestImage::random("1", &[20_000]);
    let target = format!("{}/{REPO}:1", reg.host());
    let cases: [(&[(&str, &str)], String); 3] = [
        (
            &[
                ("RUNR_REGISTRY_USERNAME", USER),
                ("RUNR_REGISTRY_PASSWORD", "wrong"),
            ],
            format!(
                "authentication failed at the registry {} (repository {REPO}, user \"runr\"): its \
                 token service answered: {} (while checking for blob sha256:",
                reg.host(),
                refusal_body(DETAIL_BAD_CREDENTIALS).trim_end()
            ),
        ),
        (
            &[],
            format!(
                "authentication failed at the registry {} (repository {REPO}, no credentials: \
                 RUNR_REGISTRY_USERNAME is unset): its token service answered: {} (while checking \
                 for blob sha256:",
                reg.host(),
                refusal_body(DETAIL_NO_CREDENTIALS).trim_end()
            ),
        ),
        // The right password of a user who may only pull: the token is issued, the upload
        // is refused by the registry (distribution says 401 insufficient_scope).
        (
            &[
                ("RUNR_REGISTRY_USERNAME", "reader"),
                ("RUNR_REGISTRY_PASSWORD", "r3ad"),
            ],
            format!(
                "authorization failed at the registry {} (repository {REPO}, user \"reader\"): the \
                 token its token service issued does not grant the access; it answered HTTP 401: \
                 {{\"errors\":[{{\"code\":\"UNAUTHORIZED\",\"message\":\"authentication required\"",
                reg.host()
            ),
        ),
    ];
    for (env, want) in cases {
        let work = tempfile::tempdir().unwrap();
        let data = oci_archive(&image, work.path());
        let (s, r) = upload(work.path(), &data, &target, env);
        assert_eq!(s["status"], "failed", "{s}");
        let msg = s["message"].as_str().unwrap();
        eprintln!("refused: {msg}");
        assert!(
            msg.starts_with(&want),
            "{msg}\nwanted: {want}…\n{}",
            r.log()
        );
        assert!(!msg.contains('\n'), "{msg:?}");
        assert!(!msg.contains("s3cret") && !msg.contains("r3ad"), "{msg}");
        // Refusals are not retried.
        assert!(!r.log().contains("retrying"), "{}", r.log());
    }
    // Nothing was tagged.
    let out = skopeo_output(&[
        "inspect",
        "--tls-verify=false",
        "--creds",
        &format!("{USER}:{PASSWORD}"),
        &format!("docker://{target}"),
    ]);
    assert!(!out.success(), "{out:?}");
}

/// The push asks the token service once, whatever the number of blobs it pushes in parallel:
/// a wrong password (or none) ends it after that one refusal, a pull-only user after the issued
/// token and the one request that tells the registry's refusal apart; the right password pushes
/// everything, HEADs and read-back included, with one token.
#[test]
fn a_refused_credential_ends_the_push_after_one_token_request() {
    if !tools() {
        return;
    }
    let reg = TokenRegistry::builder(USER, PASSWORD)
        .user(User::with_actions("reader", "r3ad", &["pull"]))
        .start();
    // Six layers and a config: seven blob pushes, four at a time.
    let image = TestImage::random("1", &[20_000, 20_001, 20_002, 20_003, 20_004, 20_005]);
    let target = format!("{}/{REPO}:1", reg.host());
    // (environment, how the message starts, token requests)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, u64);
    let cases: [Case; 4] = [
        (
            &[
                ("RUNR_REGISTRY_USERNAME", USER),
                ("RUNR_REGISTRY_PASSWORD", "wrong"),
            ],
            "authentication failed",
            1,
        ),
        (&[], "authentication failed", 1),
        (
            &[
                ("RUNR_REGISTRY_USERNAME", "reader"),
                ("RUNR_REGISTRY_PASSWORD", "r3ad"),
            ],
            "authorization failed",
            2,
        ),
        (
            &[
                ("RUNR_REGISTRY_USERNAME", USER),
                ("RUNR_REGISTRY_PASSWORD", PASSWORD),
            ],
            "",
            1,
        ),
    ];
    for (env, refusal, requests) in cases {
        let before = reg.token_requests();
        let work = tempfile::tempdir().unwrap();
        let data = oci_archive(&image, work.path());
        let (s, r) = upload(work.path(), &data, &target, env);
        let asked = reg.token_requests() - before;
        let log = reg.tokens().log();
        let log = &log[before as usize..];
        if refusal.is_empty() {
            assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
            assert_eq!(s["push"]["blobs_pushed"], 7, "{s}");
        } else {
            assert_eq!(s["status"], "failed", "{s}");
            let msg = s["message"].as_str().unwrap();
            assert!(msg.starts_with(refusal), "{msg}");
        }
        assert_eq!(asked, requests, "{env:?}: {log:?}\n{}", r.log());
        assert!(!r.log().contains("retrying"), "{}", r.log());
    }
}

/// The token service is down when the push starts: an outage, retried with the backoff (not
/// reported as a refusal), and the push goes on once it answers again.
#[test]
fn a_token_service_outage_is_retried_not_taken_for_a_refusal() {
    if !tools() {
        return;
    }
    let mut reg = TokenRegistry::start(USER, PASSWORD);
    reg.stop_token_service();
    let image = TestImage::random("1", &[30_000, 30_001]);
    let target = format!("{}/{REPO}:1", reg.host());
    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    let dir = work.path().join("upload");
    std::fs::create_dir(&dir).unwrap();
    let r = Receiver::for_data(
        &dir,
        &data,
        &[
            ("RUNR_UPLOAD_TARGET", target.as_str()),
            ("RUNR_REGISTRY_USERNAME", USER),
            ("RUNR_REGISTRY_PASSWORD", PASSWORD),
        ],
    );
    assert_eq!(r.put(0, &data).0, 200);
    assert_eq!(r.complete().0, 202);
    runr_testkit::wait_for(
        "the receiver to retry the token flow",
        Duration::from_secs(60),
        || {
            r.log()
                .contains("token flow failed, retrying")
                .then_some(())
        },
    );
    reg.restart_token_service();
    let s = r.finished();
    assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
    assert_eq!(reg.tokens().issued(), 1, "{:?}", reg.tokens().log());
    pulled_whole(
        &target,
        &image,
        &[
            "--src-tls-verify=false",
            "--src-creds",
            &format!("{USER}:{PASSWORD}"),
        ],
    );
}

#[test]
fn a_registry_certificate_from_an_unknown_ca_fails_at_once_and_its_ca_makes_it_work() {
    if !tools() {
        return;
    }
    let reg = TlsRegistry::start();
    let image = TestImage::random("1", &[20_000]);
    let target = format!("{}/{REPO}:1", reg.host());
    let tls = [("RUNR_REGISTRY_PLAIN_HTTP", "0")];

    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    let started = Instant::now();
    let (s, r) = upload(work.path(), &data, &target, &tls);
    let took = started.elapsed();
    assert_eq!(s["status"], "failed", "{s}");
    let msg = s["message"].as_str().unwrap();
    eprintln!("unknown CA: {msg}");
    assert!(
        msg.starts_with(&format!(
            "TLS with the registry {} failed: invalid peer certificate: UnknownIssuer (",
            reg.host()
        )),
        "{msg}"
    );
    assert!(!r.log().contains("retrying"), "not retried: {}", r.log());
    assert!(took < Duration::from_secs(30), "{took:?}");

    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    let ca = reg.ca_file().display().to_string();
    let (s, r) = upload(
        work.path(),
        &data,
        &target,
        &[
            ("RUNR_REGISTRY_PLAIN_HTTP", "0"),
            ("RUNR_REGISTRY_CA_FILE", &ca),
        ],
    );
    assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
    let cert_dir = reg.cert_dir().display().to_string();
    pulled_whole(&target, &image, &["--src-cert-dir", &cert_dir]);
}

/// A classic archive sent in order, `none`: its large layer streams in a chunked upload while
/// the upload arrives, through the token-protected registry.
fn streamed_upload(
    reg: &TokenRegistry,
    work: &Path,
    image: &TestImage,
    env: &[(&str, &str)],
    pause: Option<Duration>,
) -> (Value, Receiver) {
    const CHUNK: usize = 1 << 20;
    let data = crate::stream::classic_archive(image);
    let dir = work.join("upload");
    std::fs::create_dir(&dir).unwrap();
    let target = format!("{}/{REPO}:1", reg.host());
    let mut all = vec![
        ("RUNR_UPLOAD_TARGET", target.as_str()),
        ("RUNR_UPLOAD_COMPRESS", "none"),
    ];
    all.extend_from_slice(env);
    let r = Receiver::for_data(&dir, &data, &all);
    // The first half of the first layer, then (after the pause) the rest.
    let half = {
        let mut tar = tar::Archive::new(&data[..]);
        let e = tar.entries().unwrap().next().unwrap().unwrap();
        (e.raw_file_position() + e.size() / 2) as usize
    };
    assert_eq!(r.put(0, &data[..half]).0, 200);
    if let Some(pause) = pause {
        r.wait_status("the first layer to stream", |s| {
            s["push"]["bytes_pushed"].as_u64().unwrap_or(0) > 0
        });
        std::thread::sleep(pause);
    }
    for start in (half..data.len()).step_by(CHUNK) {
        let end = (start + CHUNK).min(data.len());
        assert_eq!(r.put(start as u64, &data[start..end]).0, 200);
    }
    assert_eq!(r.complete().0, 202);
    let s = r.finished();
    (s, r)
}

/// A push that outlives its token: with tokens of one second, a layer whose upload pauses
/// longer than that is committed with a renewed token (asked for before the old one expires,
/// with the same credentials and scope), and the image is whole.
#[test]
fn a_layer_streamed_longer_than_its_token_lives_renews_it() {
    if !tools() {
        return;
    }
    let reg = TokenRegistry::builder(USER, PASSWORD)
        .ttl(Duration::from_secs(1))
        .start();
    let image = TestImage::random("1", &[4 << 20, 20_000]);
    let work = tempfile::tempdir().unwrap();
    let creds = [
        ("RUNR_REGISTRY_USERNAME", USER),
        ("RUNR_REGISTRY_PASSWORD", PASSWORD),
    ];
    // Longer than the token lives: its commit comes after its renewal is due.
    let (s, r) = streamed_upload(
        &reg,
        work.path(),
        &image,
        &creds,
        Some(Duration::from_millis(1500)),
    );
    assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
    let log = r.log();
    assert!(
        log.contains("layer pushed while the upload arrives"),
        "{log}"
    );
    assert!(log.contains("registry token renewed"), "{log}");
    let tokens = reg.tokens().log();
    assert!(tokens.len() >= 2, "{tokens:?}");
    for t in &tokens {
        assert_eq!(t.status, 200, "{tokens:?}");
        assert_eq!(t.user.as_deref(), Some(USER), "{tokens:?}");
        assert_eq!(
            t.scopes,
            [format!("repository:{REPO}:pull,push")],
            "{tokens:?}"
        );
    }
    pulled_whole(
        &format!("{}/{REPO}:1", reg.host()),
        &image,
        &[
            "--src-tls-verify=false",
            "--src-creds",
            &format!("{USER}:{PASSWORD}"),
        ],
    );
}

/// A wrong password while a layer streams: the follower's chunked upload is refused at its
/// grant (one token request, nothing retried) and the pass reports the refusal after one
/// request of its own; no tag.
#[test]
fn a_refused_credential_stops_a_streamed_push_at_once() {
    if !tools() {
        return;
    }
    let reg = TokenRegistry::start(USER, PASSWORD);
    let image = TestImage::random("1", &[4 << 20, 2 << 20, 20_000]);
    let work = tempfile::tempdir().unwrap();
    let (s, r) = streamed_upload(
        &reg,
        work.path(),
        &image,
        &[
            ("RUNR_REGISTRY_USERNAME", USER),
            ("RUNR_REGISTRY_PASSWORD", "wrong"),
        ],
        None,
    );
    assert_eq!(s["status"], "failed", "{s}");
    let msg = s["message"].as_str().unwrap();
    assert!(msg.starts_with("authentication failed"), "{msg}");
    let log = r.log();
    assert!(!log.contains("retrying"), "{log}");
    // One for the follower, which stops there (its other layer is refused with the same
    // answer), one for the pass.
    assert!(
        log.contains("the follower's push failed") && log.contains("authentication failed"),
        "{log}"
    );
    assert!(reg.token_requests() <= 2, "{:?}", reg.tokens().log());
    assert_eq!(reg.tokens().issued(), 0, "{:?}", reg.tokens().log());
}
