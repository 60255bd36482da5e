//! SIGTERM (Kubernetes stopping the Job: its deadline, a deletion, a drain) and SIGINT (Ctrl-C)
//! while blobs are stalled mid-transfer: the summary still comes out, every image accounted for,
//! what was confirmed kept, the rest failed with the signal, exit 1.
//!
//! The stalls last forever and the per-image timeout is far away, so an exit at all proves the
//! signal ended the run; how fast it does (within 2 s) is measured by bench/prewarm.sh, not here.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use runr_testkit::{free_port, wait_for, Registry};

use crate::support::{base_env, Prewarm, SlowLink};
use crate::{tools_present, upstream};

/// A hang guard, far above the expected exit (milliseconds after the signal) and far below what
/// waiting out the stall would take ([`IMAGE_TIMEOUT`]).
const HANG_GUARD: Duration = Duration::from_secs(60);
/// Per-image timeout: without the signal, prewarm would wait this long for the stalled layers.
const IMAGE_TIMEOUT: &str = "30m";

fn stop_mid_transfer(signal: Signal, name: &str) {
    if !tools_present() {
        return;
    }
    let up = upstream();
    let (config, config_size) = up.layout.config_of(&up.big);
    // Every answer connection from the upstream hangs after 1 MiB: the 2 MiB layers of big:1
    // stall mid-blob, everything of small:1 (and big's config) goes through.
    let link = SlowLink::stalling(up.registry.addr(), 1 << 20);
    let cache = Registry::start_proxy(&link.url());
    let env = crate::edges::with(
        &base_env(&cache.host(), "small:1 big:1"),
        &[
            ("RUNR_PREWARM_LOG", "debug"),
            ("RUNR_PREWARM_TIMEOUT", IMAGE_TIMEOUT),
        ],
    );
    let mut prewarm = Prewarm::start(&env, &[]);
    prewarm.wait_for_log("image warmed image=small:1", Duration::from_secs(60));
    // big's config is confirmed: a result the signal must not lose.
    prewarm.wait_for_log(
        &format!("stored blob=\"blob big@{config}\""),
        Duration::from_secs(60),
    );
    wait_for("a layer to stall mid-blob", Duration::from_secs(30), || {
        (link.stalled() > 0).then_some(())
    });

    let sent = Instant::now();
    prewarm.signal(signal);
    let done = prewarm.finish(HANG_GUARD);
    eprintln!(
        "exit {:?} after {name}, {} connections stalled",
        sent.elapsed(),
        link.stalled()
    );
    assert_eq!(done.code, 1, "{done:?}");

    let summary = done.summary();
    let images = summary["images"].as_array().unwrap();
    let names: Vec<&str> = images
        .iter()
        .map(|i| i["image"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["small:1", "big:1"], "{summary}");
    assert_eq!(
        (summary["warmed"].as_u64(), summary["failed"].as_u64()),
        (Some(1), Some(1))
    );

    let small = done.image(&summary, "small:1");
    assert_eq!(small["status"], "warmed", "{small}");
    assert_eq!(small["error"], serde_json::Value::Null);
    assert_eq!(small["fetched_bytes"], small["bytes"], "{done:?}");

    let big = done.image(&summary, "big:1");
    assert_eq!(big["status"], "failed", "{big}");
    let error = big["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!("terminated by {name} after ")) && error.contains(" s"),
        "{error}"
    );
    assert_eq!(big["digest"], up.big.digest.as_str(), "{big}");
    assert_eq!(big["blobs"], 4, "{big}");
    assert_eq!(
        big["fetched_bytes"].as_u64(),
        Some(config_size),
        "the confirmed config is kept, the stalled layers are not counted: {big}"
    );
    assert!(done.stderr.contains("image failed image=big:1"), "{done:?}");
    assert!(
        done.stderr.contains("prewarm done with failures"),
        "{done:?}"
    );
    drop(link);
}

#[test]
fn sigterm_mid_transfer_prints_the_summary_and_exits_1() {
    stop_mid_transfer(Signal::SIGTERM, "SIGTERM");
}

#[test]
fn sigint_mid_transfer_prints_the_summary_and_exits_1() {
    stop_mid_transfer(Signal::SIGINT, "SIGINT");
}

/// A signal while prewarm still waits for the registry to come up: every image fails with it.
#[test]
fn sigterm_while_waiting_for_the_registry_fails_every_image() {
    let port = free_port();
    let env = crate::edges::with(
        &base_env(&format!("127.0.0.1:{port}"), "a:1 b:2"),
        &[
            ("RUNR_PREWARM_WAIT", IMAGE_TIMEOUT),
            ("RUNR_PREWARM_TIMEOUT", IMAGE_TIMEOUT),
        ],
    );
    let mut prewarm = Prewarm::start(&env, &[]);
    prewarm.wait_for_log(
        "waiting for the registry to answer GET /v2/",
        Duration::from_secs(20),
    );
    prewarm.signal(Signal::SIGTERM);
    let done = prewarm.finish(HANG_GUARD);
    assert_eq!(done.code, 1, "{done:?}");
    let summary = done.summary();
    assert_eq!(summary["failed"], 2, "{summary}");
    for name in ["a:1", "b:2"] {
        let image = done.image(&summary, name);
        assert_eq!(image["status"], "failed");
        assert_eq!(image["attempts"], 0, "{image}");
        let error = image["error"].as_str().unwrap();
        assert!(error.starts_with("terminated by SIGTERM after "), "{error}");
        assert!(
            error.contains("waiting for the registry to answer GET /v2/"),
            "{error}"
        );
    }
}
