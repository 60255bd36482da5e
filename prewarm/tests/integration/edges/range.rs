//! A pull-through cache that ignores `Range` (answers `bytes=0-0` with 200 and the whole blob):
//! prewarm notices, says so once, confirms storage with HEAD where the cache answers it from its
//! store, else by reading each blob once more, and counts the bytes it really read.

use std::time::Duration;

use runr_testkit::range_cache::HeadMode;
use runr_testkit::{wait_for, RangeIgnoringCache};

use super::with;
use crate::support::{base_env, run, Finished, Prewarm};
use crate::{tools_present, upstream, Upstream};

const WITH_HEAD: &str = "the cache ignores Range requests; confirming with HEAD instead";
const BY_READING: &str = "the cache ignores Range requests and its HEAD was not seen to answer \
                          from its store; confirming by reading each blob once more instead";

/// Every blob (config and layers) of small:1 and big:1, with its size.
fn blobs(up: &Upstream) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for manifest in [&up.small, &up.big] {
        out.push(up.layout.config_of(manifest));
        for layer in up.layout.layers_of(manifest) {
            let size = std::fs::metadata(crate::support::blob_file(&up.registry, &layer))
                .unwrap()
                .len();
            out.push((layer, size));
        }
    }
    out
}

fn said(done: &Finished, line: &str) -> usize {
    done.stderr.lines().filter(|l| l.contains(line)).count()
}

#[test]
fn a_cache_that_ignores_range_is_confirmed_with_head() {
    if !tools_present() {
        return;
    }
    let up = upstream();
    // It stores what it served only when the test says so, and HEAD says 404 until then: prewarm
    // suspects the cache (2 s of whole-blob answers) and asks HEAD, which answers from the store;
    // the stores are released once that HEAD was asked. (Where every blob is stored before that,
    // see the next test.)
    let cache = RangeIgnoringCache::builder(up.registry.addr())
        .hold_stores()
        .start();
    let env = with(
        &base_env(&cache.host(), "small:1 big:1"),
        &[("RUNR_PREWARM_CONFIRM_WAIT", "10m")],
    );
    let prewarm = Prewarm::start(&env, &[]);
    wait_for(
        "a HEAD for a blob not stored yet",
        Duration::from_secs(120),
        || {
            cache
                .all_stats()
                .iter()
                .any(|(digest, s)| s.heads > 0 && !cache.is_stored(digest))
                .then_some(())
        },
    );
    cache.release_stores();
    let done = prewarm.finish(Duration::from_secs(120));
    assert_eq!(done.code, 0, "{done:?}");
    assert_eq!(said(&done, WITH_HEAD), 1, "said once: {done:?}");
    assert_eq!(said(&done, BY_READING), 0, "{done:?}");
    let summary = done.summary();
    assert_eq!(summary["warmed"], 2, "{done:?}");
    for image in summary["images"].as_array().unwrap() {
        assert!(image["bytes"].as_u64().unwrap() > 0);
        assert_eq!(
            image["fetched_bytes"], image["bytes"],
            "each blob was read whole once: {image}"
        );
        assert_eq!(image["attempts"], 1, "{image}");
    }
    for (digest, size) in blobs(&up) {
        assert!(cache.is_stored(&digest), "{digest} not stored");
        let stats = cache.stats(&digest);
        // Each probe before the store landed made the cache fetch it again.
        assert!(stats.upstream_fetches >= 1, "{digest}: {stats:?}");
        assert!(stats.served_bytes >= size, "{digest}: {stats:?}");
        assert!(stats.heads >= 1, "{digest}: {stats:?}");
    }
}

/// A HEAD that is refused or asks the upstream cannot confirm anything; nor can one answering
/// from the store be told from those when every blob is already stored by the time prewarm
/// suspects the cache (there is no 404 to see). Each blob is then read a second time.
#[test]
fn a_cache_that_ignores_range_without_a_usable_head_is_confirmed_by_reading_again() {
    if !tools_present() {
        return;
    }
    let up = upstream();
    for mode in [
        HeadMode::NotAllowed,
        HeadMode::Upstream,
        HeadMode::FromStore,
    ] {
        let cache = RangeIgnoringCache::builder(up.registry.addr())
            .head(mode)
            .start();
        let env = with(
            &base_env(&cache.host(), "small:1 big:1"),
            &[("RUNR_PREWARM_CONFIRM_WAIT", "2s")],
        );
        let done = run(&env);
        assert_eq!(done.code, 0, "{mode:?}: {done:?}");
        assert_eq!(said(&done, BY_READING), 1, "{mode:?}: said once: {done:?}");
        assert_eq!(said(&done, WITH_HEAD), 0, "{mode:?}: {done:?}");
        let summary = done.summary();
        for image in summary["images"].as_array().unwrap() {
            assert_eq!(image["status"], "warmed", "{mode:?}: {image}");
            assert_eq!(
                image["fetched_bytes"].as_u64(),
                image["bytes"].as_u64().map(|b| 2 * b),
                "{mode:?}: each blob was read whole twice: {image}"
            );
        }
        for (digest, _) in blobs(&up) {
            assert!(cache.is_stored(&digest), "{mode:?}: {digest} not stored");
            assert_eq!(
                cache.stats(&digest).upstream_fetches,
                1,
                "{mode:?}: {digest}"
            );
        }
    }
}
