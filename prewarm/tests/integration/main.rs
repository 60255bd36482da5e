//! End-to-end tests: the real `runr-prewarm` binary against a real pull-through cache
//! (`docker-registry` in proxy mode) in front of a real upstream registry holding images pushed
//! with skopeo. The proof of a warm cache is always the same: with the upstream stopped,
//! `skopeo copy docker://cache/… dir:…` succeeds. [`edges`] covers what an operator sees when
//! something goes wrong: a signal mid-run, refused credentials, bad certificates, a cache that
//! ignores `Range`.

mod edges;
mod support;

use std::time::Duration;

use runr_testkit::{free_port, have_tool, Registry};
use support::{base_env, blob_file, pull_from, run, Desc, Layout, Prewarm, SlowLink};

/// The upstream's test images: `small:1` (one small layer), `multi:1` (amd64 + arm64 +
/// attestation index) and `big:1` (three random layers of 2 MiB).
pub(crate) struct Upstream {
    registry: Registry,
    layout: Layout,
    small: Desc,
    big: Desc,
}

fn tools_present() -> bool {
    runr_testkit::tools_present(&["docker-registry", "skopeo"])
}

fn upstream() -> Upstream {
    let registry = Registry::start();
    let layout = Layout::new();
    let small = layout.image("linux", "amd64", &[20_000]);
    layout.push(&small, &registry, "small", "1");
    let multi = layout.multi_platform();
    layout.push(&multi, &registry, "multi", "1");
    let big = layout.image("linux", "amd64", &[2 << 20, 2 << 20, 2 << 20]);
    layout.push(&big, &registry, "big", "1");
    Upstream {
        registry,
        layout,
        small,
        big,
    }
}

fn env_with(cache: &Registry, images: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = base_env(&cache.host(), images);
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

fn assert_pullable(cache: &Registry, image: &str, args: &[&str]) {
    if let Err(e) = pull_from(cache, image, args) {
        panic!(
            "{image} is not pullable from the cache: {e}\n--- cache log:\n{}",
            cache.log()
        );
    }
}

#[test]
fn warms_every_image_and_a_rerun_is_cheap() {
    if !tools_present() {
        return;
    }
    let mut up = upstream();
    let cache = Registry::start_proxy(&up.registry.url());
    let env = env_with(&cache, "small:1, multi:1\nbig:1", &[]);

    let first = run(&env);
    assert_eq!(first.code, 0, "{first:?}");
    let summary = first.summary();
    assert_eq!(summary["warmed"], 3, "{first:?}");
    let big = first.image(&summary, "big:1");
    assert_eq!(big["status"], "warmed");
    assert_eq!(big["digest"], up.big.digest.as_str());
    assert_eq!(big["blobs"], 4, "config + 3 layers");
    assert!(big["bytes"].as_u64().unwrap() > 6 << 20, "{big}");
    assert_eq!(
        big["fetched_bytes"], big["bytes"],
        "a cold cache serves everything"
    );
    assert_eq!(big["attempts"], 1);
    let multi = first.image(&summary, "multi:1");
    assert_eq!(
        multi["blobs"], 5,
        "two configs and three layers; no attestation"
    );
    assert!(
        first.stderr.contains("image warmed image=big:1"),
        "{first:?}"
    );
    assert!(first.stderr.contains("prewarm done"), "{first:?}");
    // distribution's proxy honours Range once it stores a blob: never taken for one that
    // ignores it, however its first probes were answered.
    assert!(!first.stderr.contains("ignores Range"), "{first:?}");

    // Warm cache: every blob answers the Range probe with 206, nothing is read again.
    let second = run(&env);
    assert_eq!(second.code, 0, "{second:?}");
    assert!(!second.stderr.contains("ignores Range"), "{second:?}");
    let summary = second.summary();
    for image in summary["images"].as_array().unwrap() {
        assert_eq!(image["fetched_bytes"], 0, "{image}");
        assert_eq!(image["status"], "warmed");
    }

    up.registry.stop();
    assert_pullable(&cache, "small:1", &[]);
    assert_pullable(&cache, "big:1", &[]);
    assert_pullable(&cache, "multi:1", &["--override-arch", "amd64"]);
    assert_pullable(&cache, "multi:1", &["--override-arch", "arm64"]);
}

#[test]
fn a_cache_with_basic_auth_is_warmed_with_the_credentials_only() {
    if !tools_present() || !have_tool("htpasswd") {
        println!("skipping: htpasswd is not installed (.ci/run installs apache2-utils)");
        return;
    }
    let mut up = upstream();
    let cache = Registry::start_proxy_with_basic_auth(&up.registry.url(), "runr", "s3cret");

    let anonymous = run(&env_with(&cache, "small:1", &[]));
    assert_eq!(anonymous.code, 1, "{anonymous:?}");
    let image = anonymous.image(&anonymous.summary(), "small:1").clone();
    assert_eq!(image["status"], "failed", "{anonymous:?}");
    // No token service here: the registry's own 401 is quoted.
    assert_eq!(
        image["error"].as_str(),
        Some(
            format!(
                "authentication failed at the registry {} (repository small, no credentials: \
                 RUNR_REGISTRY_USERNAME is unset): it answered HTTP 401: {{\"errors\":[{{\"code\":\
                 \"UNAUTHORIZED\",\"message\":\"authentication required\",\"detail\":[{{\
                 \"Type\":\"repository\",\"Class\":\"\",\"Name\":\"small\",\"Action\":\
                 \"pull\"}}]}}]}}",
                cache.host()
            )
            .as_str()
        ),
        "{anonymous:?}"
    );
    assert_eq!(image["attempts"], 1, "{anonymous:?}");

    let with_creds = run(&env_with(
        &cache,
        "small:1",
        &[
            ("RUNR_REGISTRY_USERNAME", "runr"),
            ("RUNR_REGISTRY_PASSWORD", "s3cret"),
        ],
    ));
    assert_eq!(with_creds.code, 0, "{with_creds:?}");
    assert_eq!(with_creds.summary()["warmed"], 1, "{with_creds:?}");

    up.registry.stop();
    let dest = tempfile::tempdir().unwrap();
    runr_testkit::skopeo(&[
        "copy",
        "--src-tls-verify=false",
        "--src-creds",
        "runr:s3cret",
        &format!("docker://{}/small:1", cache.host()),
        &format!("dir:{}", dest.path().display()),
    ]);
}

#[test]
fn waits_for_a_cache_that_starts_after_the_job() {
    if !tools_present() {
        return;
    }
    let mut up = upstream();
    let port = free_port();
    let mut env = base_env(&format!("127.0.0.1:{port}"), "small:1 big:1");
    env.push(("RUNR_PREWARM_LOG".into(), "info".into()));
    let mut prewarm = Prewarm::start(&env, &["run"]);
    prewarm.wait_for_log(
        "waiting for the registry to answer GET /v2/",
        Duration::from_secs(20),
    );
    let cache = Registry::start_proxy_on_port(&up.registry.url(), port);
    let done = prewarm.finish(Duration::from_secs(60));
    assert_eq!(done.code, 0, "{done:?}");
    assert!(done.stderr.contains("registry answers again"), "{done:?}");
    assert_eq!(done.summary()["warmed"], 2, "{done:?}");

    up.registry.stop();
    assert_pullable(&cache, "small:1", &[]);
    assert_pullable(&cache, "big:1", &[]);
}

#[test]
fn survives_a_cache_restart_mid_run() {
    if !tools_present() {
        return;
    }
    let mut up = upstream();
    // About 1 MiB/s per connection between cache and upstream: the 2 MiB layers take seconds,
    // so the restart below lands while they stream.
    let link = SlowLink::start(up.registry.addr(), 1 << 20);
    let mut cache = Registry::start_proxy(&link.url());
    let env = env_with(&cache, "big:1 small:1", &[("RUNR_PREWARM_LOG", "info")]);
    let prewarm = Prewarm::start(&env, &[]);
    // The manifest is stored first; the blob transfers start right after it.
    let repo = cache
        .storage()
        .join("docker/registry/v2/repositories/big/_manifests");
    runr_testkit::wait_for(
        "the cache to store big's manifest",
        Duration::from_secs(30),
        || repo.exists().then_some(()),
    );
    cache.restart();
    let done = prewarm.finish(Duration::from_secs(90));
    assert_eq!(done.code, 0, "{done:?}");
    assert!(
        done.stderr.contains("attempt failed"),
        "the restart must have cut a transfer: {done:?}"
    );
    assert_eq!(done.summary()["warmed"], 2, "{done:?}");

    drop(link);
    up.registry.stop();
    assert_pullable(&cache, "big:1", &[]);
    assert_pullable(&cache, "small:1", &[]);
}

#[test]
fn a_missing_image_fails_after_its_attempts_and_the_others_are_warmed() {
    if !tools_present() {
        return;
    }
    let mut up = upstream();
    let cache = Registry::start_proxy(&up.registry.url());
    let env = env_with(&cache, "nope:1,small:1", &[("RUNR_PREWARM_ATTEMPTS", "2")]);
    let done = run(&env);
    assert_eq!(done.code, 1, "{done:?}");
    let summary = done.summary();
    assert_eq!(
        (summary["warmed"].as_u64(), summary["failed"].as_u64()),
        (Some(1), Some(1))
    );
    let nope = done.image(&summary, "nope:1");
    assert_eq!(nope["status"], "failed");
    assert_eq!(nope["attempts"], 2);
    let error = nope["error"].as_str().unwrap();
    assert!(error.contains("manifest nope:1: HTTP 404"), "{error}");
    assert!(
        done.stderr.contains("image failed image=nope:1"),
        "{done:?}"
    );

    up.registry.stop();
    assert_pullable(&cache, "small:1", &[]);
}

#[test]
fn platform_filter_and_digest_reference() {
    if !tools_present() {
        return;
    }
    let mut up = upstream();
    let cache = Registry::start_proxy(&up.registry.url());
    let small_by_digest = format!("small@{}", up.small.digest);
    let env = env_with(
        &cache,
        &format!("multi:1 {small_by_digest}"),
        &[("RUNR_PREWARM_PLATFORMS", "linux/arm64")],
    );
    let done = run(&env);
    assert_eq!(done.code, 0, "{done:?}");
    let summary = done.summary();
    assert_eq!(done.image(&summary, "multi:1")["blobs"], 2, "arm64 only");
    assert_eq!(
        done.image(&summary, &small_by_digest)["digest"],
        up.small.digest.as_str()
    );

    up.registry.stop();
    assert_pullable(&cache, "multi:1", &["--override-arch", "arm64"]);
    assert!(
        pull_from(&cache, "multi:1", &["--override-arch", "amd64"]).is_err(),
        "amd64 was filtered out and must not be in the cache"
    );
    assert_pullable(&cache, &small_by_digest, &[]);

    // A filter that matches nothing fails the image at once, naming what the index has.
    let env = env_with(
        &cache,
        "multi:1",
        &[("RUNR_PREWARM_PLATFORMS", "linux/s390x")],
    );
    let done = run(&env);
    assert_eq!(done.code, 1, "{done:?}");
    let summary = done.summary();
    let multi = done.image(&summary, "multi:1");
    assert_eq!(multi["attempts"], 1, "not worth retrying: {multi}");
    assert!(
        multi["error"]
            .as_str()
            .unwrap()
            .contains("it has: linux/amd64, linux/arm64"),
        "{multi}"
    );
}

#[test]
fn a_corrupted_upstream_blob_is_reported_as_a_digest_mismatch() {
    if !tools_present() {
        return;
    }
    let up = upstream();
    let layer = up.layout.layers_of(&up.big)[1].clone();
    support::overwrite_same_size(&blob_file(&up.registry, &layer));
    let cache = Registry::start_proxy(&up.registry.url());
    let env = env_with(&cache, "big:1 small:1", &[("RUNR_PREWARM_ATTEMPTS", "2")]);
    let done = run(&env);
    assert_eq!(done.code, 1, "{done:?}");
    let summary = done.summary();
    let big = done.image(&summary, "big:1");
    let error = big["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("blob big@{layer}: digest mismatch")),
        "{error}"
    );
    assert_eq!(big["attempts"], 2);
    assert_eq!(done.image(&summary, "small:1")["status"], "warmed");
}

#[test]
fn bad_configuration_exits_2_naming_each_variable() {
    let env: Vec<(String, String)> = [
        ("RUNR_PREWARM_REGISTRY", "http://cache:5000"),
        ("RUNR_PREWARM_IMAGES", "python:3.12,,node:22"),
        ("RUNR_PREWARM_CONCURRENCY", "0"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let done = run(&env);
    assert_eq!(done.code, 2, "{done:?}");
    assert!(done.stdout.is_empty(), "{done:?}");
    // Read as a person does: each message is quoted (it holds `=` and `"`).
    let read: Vec<String> = done
        .stderr
        .lines()
        .map(runr_testkit::logfmt::plain)
        .collect();
    let read = read.join("\n");
    for needle in [
        "RUNR_PREWARM_REGISTRY=\"http://cache:5000\"",
        "RUNR_PREWARM_IMAGES=\"python:3.12,,node:22\": entry 2 is empty",
        "RUNR_PREWARM_CONCURRENCY=\"0\"",
    ] {
        assert!(read.contains(needle), "{needle}: {done:?}");
    }
    assert_eq!(
        done.stderr.lines().count(),
        3,
        "one line per variable: {done:?}"
    );
    // In the words every binary uses for it (runr-base's one report).
    for line in read.lines() {
        assert!(
            line.starts_with("[runr-prewarm] ERROR msg=invalid configuration: RUNR_PREWARM_"),
            "{line}"
        );
    }
    assert!(!done.stderr.contains("panicked"), "{done:?}");

    let unknown = Prewarm::start(&env, &["warm"]).finish(Duration::from_secs(10));
    assert_eq!(unknown.code, 2, "{unknown:?}");

    // A CA file that exists but holds no certificate is caught before anything is contacted.
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("ca.pem");
    std::fs::write(&pem, "not a certificate\n").unwrap();
    let mut env = base_env("127.0.0.1:1", "small:1");
    env.push(("RUNR_REGISTRY_CA_FILE".into(), pem.display().to_string()));
    let done = run(&env);
    assert_eq!(done.code, 2, "{done:?}");
    assert!(done.stderr.contains("RUNR_REGISTRY_CA_FILE"), "{done:?}");
    assert!(done.stderr.contains("no PEM certificate"), "{done:?}");
}

#[test]
fn a_variable_under_the_wrong_prefix_is_warned_about_with_the_one_meant() {
    // Nothing listens on port 1: the run fails fast, after the warnings.
    let mut env = base_env("127.0.0.1:1", "small:1");
    env.retain(|(k, _)| k != "RUNR_REGISTRY_PLAIN_HTTP" && k != "RUNR_PREWARM_WAIT");
    env.push(("RUNR_PREWARM_WAIT".into(), "100ms".into()));
    env.push(("RUNR_PREWARM_PLAIN_HTTP".into(), "1".into()));
    let done = run(&env);
    assert_eq!(done.code, 1, "{done:?}");
    let warnings: Vec<&str> = done
        .stderr
        .lines()
        .filter(|l| l.contains("unknown variable"))
        .collect();
    assert_eq!(
        warnings,
        ["[runr-prewarm] WARN unknown variable, ignored variable=RUNR_PREWARM_PLAIN_HTTP did_you_mean=RUNR_REGISTRY_PLAIN_HTTP"],
        "{done:?}"
    );
    // Ignored indeed: the registry was tried over https.
    assert!(done.stderr.contains("https://127.0.0.1:1/v2/"), "{done:?}");
}

#[test]
fn version_and_help_print_the_version_and_every_variable() {
    let version = Prewarm::start(&[], &["version"]).finish(Duration::from_secs(10));
    assert_eq!(version.code, 0, "{version:?}");
    assert_eq!(
        version.stdout.lines().next(),
        Some(format!("runr-prewarm {}", env!("CARGO_PKG_VERSION")).as_str()),
        "{version:?}"
    );
    let tables = [runr_prewarm::config::VARS, runr_registry::config::VARS];
    for row in tables.iter().flat_map(|t| t.iter()) {
        let line = version
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{} ", row.name)))
            .unwrap_or_else(|| panic!("{} is not listed: {version:?}", row.name));
        assert!(line.contains(row.meaning), "{line}");
    }
    assert!(
        version.stdout.contains("RUNR_PREWARM_WAIT") && version.stdout.contains("(default: 300s)"),
        "{version:?}"
    );
    let help = Prewarm::start(&[], &["help"]).finish(Duration::from_secs(10));
    assert_eq!((help.code, &help.stdout), (0, &version.stdout), "{help:?}");
}

#[test]
fn too_many_requests_waits_as_long_as_retry_after_says() {
    if !tools_present() {
        return;
    }
    let up = upstream();
    let cache = Registry::start_proxy(&up.registry.url());
    let front = support::too_many_requests(cache.addr(), "/v2/small/manifests/1", 1, 2);
    let mut env = base_env(&front.host(), "small:1");
    env.push(("RUNR_PREWARM_BACKOFF".into(), "10ms".into()));
    let done = run(&env);
    assert_eq!(done.code, 0, "{done:?}");
    let summary = done.summary();
    assert_eq!(done.image(&summary, "small:1")["attempts"], 2, "{done:?}");
    assert!(done.stderr.contains("HTTP 429"), "{done:?}");
    // The backoff alone would be at most 10 ms: the pause must be the 2 s the registry asked for.
    let retry_in: f64 = done
        .stderr
        .lines()
        .find_map(|l| l.split("retry_in_s=").nth(1))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no retry line: {done:?}"));
    assert!(retry_in >= 2.0, "retry_in_s={retry_in}: {done:?}");
}

/// distribution's proxy can answer a confirmation probe that meets its commit with 500: the
/// blob was served whole a moment ago, so that is "not stored yet", not a failed attempt.
#[test]
fn a_500_to_a_confirmation_probe_is_not_yet_stored() {
    if !tools_present() {
        return;
    }
    let up = upstream();
    let cache = Registry::start_proxy(&up.registry.url());
    let layer = up.layout.layers_of(&up.small)[0].clone();
    // The layer's first request is the probe that gets it whole; the second, the first
    // confirmation probe, gets the 500.
    let front = support::Intercept::start(cache.addr(), &format!("/v2/small/blobs/{layer}"), |n| {
        (n == 2).then(support::distribution_500)
    });
    let mut env = base_env(&front.host(), "small:1");
    env.push(("RUNR_PREWARM_LOG".into(), "debug".into()));
    let done = run(&env);
    assert_eq!(done.code, 0, "{done:?}");
    let summary = done.summary();
    let small = done.image(&summary, "small:1");
    assert_eq!(small["attempts"], 1, "{done:?}");
    assert_eq!(small["fetched_bytes"], small["bytes"], "{done:?}");
    assert!(
        done.stderr
            .contains("confirmation probe answered 500; trying again"),
        "the 500 was not met: {done:?}"
    );
}

#[test]
fn a_long_blob_reports_progress_every_10_seconds() {
    if !tools_present() {
        return;
    }
    let up = upstream();
    // About 180 KiB/s per connection: each 2 MiB layer of big:1 takes more than 10 s.
    let link = SlowLink::start(up.registry.addr(), 180 << 10);
    let cache = Registry::start_proxy(&link.url());
    let env = env_with(&cache, "big:1", &[]);
    let done = Prewarm::start(&env, &[]).finish(Duration::from_secs(90));
    assert_eq!(done.code, 0, "{done:?}");
    let progress = done
        .stderr
        .lines()
        .find(|l| l.contains("fetching blob=\"blob big@sha256:"))
        .unwrap_or_else(|| panic!("no progress line: {done:?}"));
    assert!(
        progress.contains(" bytes=") && progress.contains(" size=2"),
        "{progress}"
    );
}

#[test]
fn an_image_slower_than_its_timeout_fails_and_the_others_do_not_wait() {
    if !tools_present() {
        return;
    }
    let up = upstream();
    let link = SlowLink::start(up.registry.addr(), 180 << 10);
    let cache = Registry::start_proxy(&link.url());
    let env = env_with(&cache, "big:1 small:1", &[("RUNR_PREWARM_TIMEOUT", "3s")]);
    let done = run(&env);
    assert_eq!(done.code, 1, "{done:?}");
    let summary = done.summary();
    let big = done.image(&summary, "big:1");
    assert_eq!(big["status"], "failed");
    assert!(
        big["error"]
            .as_str()
            .unwrap()
            .starts_with("timed out after 3s (RUNR_PREWARM_TIMEOUT)"),
        "{big}"
    );
    assert_eq!(
        done.image(&summary, "small:1")["status"],
        "warmed",
        "{done:?}"
    );
}

#[test]
fn a_blob_wanted_by_two_images_is_fetched_once_and_largest_first() {
    if !tools_present() {
        return;
    }
    let up = upstream();
    let cache = Registry::start_proxy(&up.registry.url());
    // The same image by tag and by digest: every blob is wanted twice at the same time.
    let by_digest = format!("big@{}", up.big.digest);
    let env = env_with(
        &cache,
        &format!("big:1 {by_digest}"),
        &[
            ("RUNR_PREWARM_CONCURRENCY", "1"),
            ("RUNR_PREWARM_LOG", "debug"),
        ],
    );
    let done = run(&env);
    assert_eq!(done.code, 0, "{done:?}");
    assert_eq!(done.summary()["warmed"], 2, "{done:?}");

    // At debug level each request that reads a body logs `fetched`, each Range probe answered
    // 206 logs `already cached`. The second image must make neither: it waits for the first.
    let fetched: Vec<&str> = done
        .stderr
        .lines()
        .filter(|l| l.contains("DEBUG fetched blob=\"blob big@"))
        .collect();
    assert!(
        !done.stderr.contains("already cached"),
        "a second request went out: {done:?}"
    );
    let layers = up.layout.layers_of(&up.big);
    for layer in &layers {
        let n = fetched
            .iter()
            .filter(|l| l.contains(layer.as_str()))
            .count();
        assert_eq!(n, 1, "{layer} read {n} times: {done:?}");
    }
    // One worker, largest first: the three 2 MiB layers before the small config.
    assert_eq!(fetched.len(), 4, "{done:?}");
    assert!(
        !layers.iter().any(|l| fetched[3].contains(l.as_str())),
        "the config comes last: {fetched:#?}"
    );
}
