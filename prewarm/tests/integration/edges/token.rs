//! A cache behind Bearer-token auth (distribution's `auth: token` with a token service that
//! answers as distribution's own does): warmed with the right credentials, refused at once with
//! the token service's answer quoted for wrong ones or none.

use runr_testkit::token::{refusal_body, DETAIL_BAD_CREDENTIALS, DETAIL_NO_CREDENTIALS};
use runr_testkit::{have_tool, TokenRegistry};

use super::{pull, with};
use crate::support::{base_env, run};
use crate::{tools_present, upstream};

const USER: &str = "runr";
/// A blank and a colon: the password must reach the token service as it is.
const PASSWORD: &str = "s3cret pass:word";

fn token_tools() -> bool {
    tools_present() && have_tool("openssl")
}

#[test]
fn a_token_protected_cache_is_warmed_with_the_right_credentials() {
    if !token_tools() {
        return;
    }
    let mut up = upstream();
    let cache = TokenRegistry::start_proxy(&up.registry.url(), USER, PASSWORD);
    let env = with(
        &base_env(&cache.host(), "small:1 big:1"),
        &[
            ("RUNR_REGISTRY_USERNAME", USER),
            ("RUNR_REGISTRY_PASSWORD", PASSWORD),
        ],
    );
    let done = run(&env);
    assert_eq!(done.code, 0, "{done:?}\n--- cache log:\n{}", cache.log());
    let summary = done.summary();
    assert_eq!(summary["warmed"], 2, "{done:?}");
    for image in summary["images"].as_array().unwrap() {
        assert_eq!(image["fetched_bytes"], image["bytes"], "{image}");
    }
    let log = cache.tokens().log();
    assert!(
        log.iter().any(|t| t.status == 200
            && t.user.as_deref() == Some(USER)
            && t.granted.iter().any(|g| g == "repository:big:pull")),
        "no pull token for big was issued: {log:?}"
    );
    assert_eq!(cache.tokens().refused(), 0, "{log:?}");

    // The cache holds them: with the upstream gone they still come out, through the token flow.
    up.registry.stop();
    let creds = format!("{USER}:{PASSWORD}");
    for image in ["small:1", "big:1"] {
        pull(
            &cache.host(),
            image,
            &["--src-tls-verify=false", "--src-creds", &creds],
        )
        .unwrap_or_else(|e| panic!("{image}: {e}\n--- cache log:\n{}", cache.log()));
    }
    assert!(
        pull(&cache.host(), "small:1", &["--src-tls-verify=false"]).is_err(),
        "the cache must not serve anonymous pulls"
    );
}

#[test]
fn wrong_or_missing_credentials_fail_at_once_quoting_the_token_service() {
    if !token_tools() {
        return;
    }
    let up = upstream();
    let cache = TokenRegistry::start_proxy(&up.registry.url(), USER, PASSWORD);
    for (creds, who, detail) in [
        (
            Some("wrong"),
            format!("user {USER:?}"),
            DETAIL_BAD_CREDENTIALS,
        ),
        (
            None,
            "no credentials: RUNR_REGISTRY_USERNAME is unset".to_string(),
            DETAIL_NO_CREDENTIALS,
        ),
    ] {
        let mut env = base_env(&cache.host(), "small:1");
        if let Some(password) = creds {
            env = with(
                &env,
                &[
                    ("RUNR_REGISTRY_USERNAME", USER),
                    ("RUNR_REGISTRY_PASSWORD", password),
                ],
            );
        }
        let done = run(&env);
        assert_eq!(done.code, 1, "{done:?}");
        let summary = done.summary();
        let small = done.image(&summary, "small:1");
        assert_eq!(small["status"], "failed");
        assert_eq!(small["attempts"], 1, "a refusal is not retried: {small}");
        let want = format!(
            "authentication failed at the registry {} (repository small, {who}): its token \
             service answered: {}",
            cache.host(),
            refusal_body(detail).trim_end()
        );
        assert_eq!(small["error"].as_str(), Some(want.as_str()), "{done:?}");
        assert!(
            done.stderr
                .lines()
                .map(runr_testkit::logfmt::plain)
                .any(
                    |l| l.starts_with("[runr-prewarm] ERROR image failed image=small:1")
                        && l.contains(&want)
                ),
            "{done:?}"
        );
    }
}
