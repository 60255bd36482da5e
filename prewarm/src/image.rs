//! One image: resolve its reference once, fetch the selected platforms' manifests by digest,
//! warm every config and layer blob, then confirm with Range probes that the cache holds them.
//! Attempts repeat only what is still missing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use runr_registry::oci_client::manifest::{
    OciImageIndex, OciImageManifest, IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE,
};
use runr_registry::{is_sha256, sha256_digest, Backoff};

use crate::blobs::{Blob, Fetcher, Warmed};
use crate::cache::{Cache, FetchError, RawManifest};
use crate::config::{Config, ImageRef, Platforms};
use crate::readiness::Readiness;
use crate::stop::{stopped, StopWatch};
use crate::summary::{ImageReport, Status};

/// Longest pause between two attempts, whatever the attempt number.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What every image shares.
pub struct Shared {
    /// The cache.
    pub cache: Arc<Cache>,
    /// The blob queue.
    pub fetcher: Arc<Fetcher>,
    /// Registry readiness.
    pub readiness: Readiness,
    /// Manifest requests at once. A Zot cache syncs a whole image before it answers one, so a
    /// long image list must not start every sync at the same moment.
    pub manifest_slots: tokio::sync::Semaphore,
    /// The configuration.
    pub config: Config,
    /// Set when a signal stops the run.
    pub stop: StopWatch,
}

/// What is known about an image so far; kept across attempts so that a retry does only what
/// is missing.
#[derive(Default)]
struct Progress {
    /// The digest the reference resolved to.
    digest: Option<String>,
    /// Platform manifests still to fetch (by digest).
    manifests_missing: BTreeSet<String>,
    /// Every blob of the fetched manifests, with `true` once the cache confirmed it.
    blobs: BTreeMap<Blob, bool>,
    /// Bytes read in full from the cache.
    fetched_bytes: u64,
}

impl Progress {
    /// Everything of the image is confirmed (the attempt that did it may not have returned yet).
    fn complete(&self) -> bool {
        self.digest.is_some()
            && self.manifests_missing.is_empty()
            && !self.blobs.is_empty()
            && self.blobs.values().all(|confirmed| *confirmed)
    }
}

/// How the attempts ended, before the report is made of it.
enum Ended {
    Done(Result<(), String>),
    TimedOut,
    Stopped(crate::stop::Terminated),
}

/// Warms `image` within the configured time and attempts, and reports how it went. A signal
/// ends it at once (see [`crate::stop`]), keeping what was confirmed.
pub async fn warm_image(shared: &Shared, image: &ImageRef) -> ImageReport {
    let started = Instant::now();
    let mut progress = Progress::default();
    let mut attempts = 0;
    let mut last_error = None;
    let mut stop = shared.stop.clone();
    let ended = tokio::select! {
        // A result that is there wins over a signal that came at the same moment.
        biased;
        r = tokio::time::timeout(
            shared.config.timeout,
            attempts_loop(shared, image, &mut progress, &mut attempts, &mut last_error),
        ) => r.map_or(Ended::TimedOut, Ended::Done),
        t = stopped(&mut stop) => Ended::Stopped(t),
    };
    let with_last_error = |mut msg: String| {
        if let Some(e) = &last_error {
            msg.push_str(&format!("; last error: {e}"));
        }
        msg
    };
    let outcome = match ended {
        Ended::Done(r) => r,
        Ended::TimedOut => Err(with_last_error(format!(
            "timed out after {}s (RUNR_PREWARM_TIMEOUT)",
            shared.config.timeout.as_secs()
        ))),
        Ended::Stopped(_) if progress.complete() => Ok(()),
        Ended::Stopped(t) => Err(with_last_error(t.to_string())),
    };
    let seconds = started.elapsed().as_secs_f64();
    let bytes = progress.blobs.keys().map(|b| b.size).sum();
    let report = ImageReport {
        image: image.text.clone(),
        status: if outcome.is_ok() {
            Status::Warmed
        } else {
            Status::Failed
        },
        digest: progress.digest.clone(),
        blobs: progress.blobs.len(),
        bytes,
        fetched_bytes: progress.fetched_bytes,
        seconds: (seconds * 1000.0).round() / 1000.0,
        attempts,
        error: outcome.err(),
    };
    match &report.error {
        None => tracing::info!(
            image = %image,
            digest = report.digest.as_deref().unwrap_or(""),
            blobs = report.blobs,
            bytes = report.bytes,
            fetched = report.fetched_bytes,
            seconds = report.seconds,
            attempts,
            "image warmed"
        ),
        Some(error) => tracing::error!(
            image = %image,
            digest = report.digest.as_deref().unwrap_or(""),
            seconds = report.seconds,
            attempts,
            error = %error,
            "image failed"
        ),
    }
    report
}

async fn attempts_loop(
    shared: &Shared,
    image: &ImageRef,
    progress: &mut Progress,
    attempts: &mut u32,
    last_error: &mut Option<String>,
) -> Result<(), String> {
    let backoff = Backoff {
        base: shared.config.backoff,
        max: MAX_BACKOFF,
    };
    // Attempts that count against RUNR_PREWARM_ATTEMPTS: one cut short by a registry restart
    // (the registry had to be waited for) does not.
    let mut counted = 0;
    loop {
        *attempts += 1;
        counted += 1;
        let attempt_started = Instant::now();
        let err = match attempt(shared, image, progress).await {
            Ok(()) => return Ok(()),
            Err(err) => err,
        };
        tracing::warn!(image = %image, attempt = *attempts, error = %err, "attempt failed");
        *last_error = Some(err.to_string());
        if !err.retryable() {
            return Err(err.to_string());
        }
        let mut restarted = false;
        if err.registry_gone() {
            match shared.readiness.recheck(attempt_started).await {
                Ok(back) => restarted = back,
                Err(gone) => return Err(format!("{err}; {gone}")),
            }
        }
        if restarted {
            counted -= 1;
            continue;
        }
        if counted >= shared.config.attempts {
            return Err(err.to_string());
        }
        let delay = backoff
            .delay(counted - 1)
            .max(err.retry_after().unwrap_or_default().min(MAX_BACKOFF * 5));
        tracing::info!(image = %image, retry_in_s = delay.as_secs_f64(), "retrying");
        tokio::time::sleep(delay).await;
    }
}

/// One pass over whatever is still missing. Every blob is tried and the fetched ones confirmed
/// even when another part fails, so the next attempt has less to do. A blob counts as done only
/// once the cache answers its Range probe with 206.
async fn attempt(
    shared: &Shared,
    image: &ImageRef,
    progress: &mut Progress,
) -> Result<(), FetchError> {
    let repo = image.repository.as_str();
    if progress.digest.is_none() {
        let raw = {
            let _slot = shared.manifest_slots.acquire().await;
            shared
                .cache
                .manifest(repo, image.manifest_reference())
                .await?
        };
        let what = format!("manifest {image}");
        let digest = manifest_digest(&raw, image.digest.as_deref(), &what)?;
        match parse_manifest(&raw, &what)? {
            Parsed::Image(m) => add_blobs(progress, &m, &what)?,
            Parsed::Index(index) => {
                let selected = select_platforms(&index, &shared.config.platforms, &what)?;
                progress.manifests_missing.extend(selected);
            }
        }
        progress.digest = Some(digest);
    }

    // Results are taken in as they come, not once all are in: a signal ends the attempt at any
    // point and must find everything done so far in `progress`.
    let mut first_error = None;
    let wanted: Vec<String> = progress.manifests_missing.iter().cloned().collect();
    let mut fetching: FuturesUnordered<_> = wanted
        .into_iter()
        .map(|digest| async move {
            let _slot = shared.manifest_slots.acquire().await;
            let result = fetch_platform_manifest(&shared.cache, repo, &digest).await;
            (digest, result)
        })
        .collect();
    while let Some((digest, result)) = fetching.next().await {
        match result {
            Ok((manifest, what)) => {
                add_blobs(progress, &manifest, &what)?;
                progress.manifests_missing.remove(&digest);
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }

    let missing: Vec<Blob> = progress
        .blobs
        .iter()
        .filter(|(_, confirmed)| !**confirmed)
        .map(|(b, _)| b.clone())
        .collect();
    // Each blob is confirmed as soon as its own transfer ends: the cache stores a blob while
    // serving it, so waiting for the image's last (smallest) blob first would only add latency.
    let mut warming: FuturesUnordered<_> = missing
        .into_iter()
        .map(|blob| async move {
            let result = warm_and_confirm(shared, repo, &blob).await;
            (blob, result)
        })
        .collect();
    while let Some((blob, result)) = warming.next().await {
        match result {
            Ok(bytes) => {
                progress.fetched_bytes += bytes;
                progress.blobs.insert(blob, true);
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Warms one blob and, when it was read whole, confirms the cache stored it; the bytes read
/// (twice the blob when the confirmation had to read it again).
async fn warm_and_confirm(shared: &Shared, repo: &str, blob: &Blob) -> Result<u64, FetchError> {
    match shared.fetcher.warm(repo, blob).await? {
        Warmed::Cached => Ok(0),
        Warmed::Fetched { bytes } => {
            let deadline = Instant::now() + shared.config.confirm_wait;
            match shared.fetcher.confirm(repo, blob, deadline).await {
                Ok(read_again) => Ok(bytes + read_again),
                Err(e) => {
                    // The next attempt must read it again, not trust this run's read.
                    shared.fetcher.forget(repo, blob);
                    Err(e)
                }
            }
        }
    }
}

async fn fetch_platform_manifest(
    cache: &Cache,
    repo: &str,
    digest: &str,
) -> Result<(OciImageManifest, String), FetchError> {
    let raw = cache.manifest(repo, digest).await?;
    let what = format!("manifest {repo}@{digest}");
    manifest_digest(&raw, Some(digest), &what)?;
    match parse_manifest(&raw, &what)? {
        Parsed::Image(m) => Ok((*m, what)),
        Parsed::Index(_) => Err(FetchError::BadManifest {
            what,
            reason: "an index inside an index is not supported".into(),
        }),
    }
}

/// The manifest's digest: the SHA-256 of its body, which must match the pinned digest and the
/// `Docker-Content-Digest` header when there are ones.
fn manifest_digest(
    raw: &RawManifest,
    pinned: Option<&str>,
    what: &str,
) -> Result<String, FetchError> {
    let actual = sha256_digest(&raw.body);
    for expected in [pinned, raw.digest_header.as_deref()].into_iter().flatten() {
        if expected.starts_with("sha256:") && expected != actual {
            return Err(FetchError::DigestMismatch {
                what: what.into(),
                expected: expected.into(),
                actual,
            });
        }
    }
    Ok(actual)
}

enum Parsed {
    Image(Box<OciImageManifest>),
    Index(OciImageIndex),
}

/// Parses an OCI or Docker manifest or index, by `Content-Type`, else by its `mediaType`
/// field, else by shape (OCI manifests may omit `mediaType`).
fn parse_manifest(raw: &RawManifest, what: &str) -> Result<Parsed, FetchError> {
    let bad = |reason: String| FetchError::BadManifest {
        what: what.into(),
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_slice(&raw.body).map_err(|e| bad(format!("not JSON: {e}")))?;
    let declared = value
        .get("mediaType")
        .and_then(|m| m.as_str())
        .map(str::to_string)
        .or_else(|| raw.media_type.clone())
        .filter(|m| !m.is_empty() && m != "application/json");
    let is_index = match declared.as_deref() {
        Some(OCI_IMAGE_INDEX_MEDIA_TYPE | IMAGE_MANIFEST_LIST_MEDIA_TYPE) => true,
        Some(OCI_IMAGE_MEDIA_TYPE | IMAGE_MANIFEST_MEDIA_TYPE) => false,
        Some(other) => return Err(bad(format!("unsupported media type {other}"))),
        None => value.get("manifests").is_some(),
    };
    if is_index {
        serde_json::from_value(value)
            .map(Parsed::Index)
            .map_err(|e| bad(format!("not an image index: {e}")))
    } else {
        serde_json::from_value(value)
            .map(|m| Parsed::Image(Box::new(m)))
            .map_err(|e| bad(format!("not an image manifest: {e}")))
    }
}

/// The digests of the index entries to warm. An index with none left after the filter fails
/// the image: warming nothing would hide a wrong RUNR_PREWARM_PLATFORMS.
fn select_platforms(
    index: &OciImageIndex,
    platforms: &Platforms,
    what: &str,
) -> Result<Vec<String>, FetchError> {
    let mut selected = Vec::new();
    let mut available = Vec::new();
    for entry in &index.manifests {
        let (os, arch, variant) = match &entry.platform {
            Some(p) => (
                p.os.to_string(),
                p.architecture.to_string(),
                p.variant.clone(),
            ),
            None => ("unknown".into(), "unknown".into(), None),
        };
        if os == "unknown" && arch == "unknown" {
            // Attestations (SBOM, provenance) hang off the index as unknown/unknown entries.
            continue;
        }
        let name = match &variant {
            Some(v) => format!("{os}/{arch}/{v}"),
            None => format!("{os}/{arch}"),
        };
        if platforms.wants(&os, &arch, variant.as_deref()) {
            if !is_sha256(&entry.digest) {
                return Err(FetchError::BadManifest {
                    what: what.into(),
                    reason: format!("entry {name} has an unsupported digest {}", entry.digest),
                });
            }
            selected.push(entry.digest.clone());
        }
        available.push(name);
    }
    if selected.is_empty() {
        return Err(FetchError::BadManifest {
            what: what.into(),
            reason: format!(
                "no platform of the index matches RUNR_PREWARM_PLATFORMS={platforms} (it has: {})",
                available.join(", ")
            ),
        });
    }
    Ok(selected)
}

/// Adds the config and layers of `manifest` to the blobs to warm. Foreign layers (with `urls`)
/// are not served by the registry and are skipped.
fn add_blobs(
    progress: &mut Progress,
    manifest: &OciImageManifest,
    what: &str,
) -> Result<(), FetchError> {
    for desc in std::iter::once(&manifest.config).chain(&manifest.layers) {
        if desc.urls.as_ref().is_some_and(|u| !u.is_empty()) {
            tracing::debug!(manifest = what, digest = %desc.digest, "skipping a foreign layer");
            continue;
        }
        let size = u64::try_from(desc.size).ok();
        match size {
            Some(size) if is_sha256(&desc.digest) => {
                progress
                    .blobs
                    .entry(Blob {
                        digest: desc.digest.clone(),
                        size,
                    })
                    .or_insert(false);
            }
            _ => {
                return Err(FetchError::BadManifest {
                    what: what.into(),
                    reason: format!(
                        "descriptor {} of size {} is not a sha256 blob prewarm can check",
                        desc.digest, desc.size
                    ),
                })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(body: &str, media_type: Option<&str>) -> RawManifest {
        RawManifest {
            body: body.as_bytes().to_vec(),
            media_type: media_type.map(str::to_string),
            digest_header: None,
        }
    }

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    const D3: &str = "sha256:3333333333333333333333333333333333333333333333333333333333333333";

    fn index() -> String {
        format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_IMAGE_INDEX_MEDIA_TYPE}","manifests":[
            {{"mediaType":"{OCI_IMAGE_MEDIA_TYPE}","digest":"{D1}","size":1,"platform":{{"os":"linux","architecture":"amd64"}}}},
            {{"mediaType":"{OCI_IMAGE_MEDIA_TYPE}","digest":"{D2}","size":1,"platform":{{"os":"linux","architecture":"arm64","variant":"v8"}}}},
            {{"mediaType":"{OCI_IMAGE_MEDIA_TYPE}","digest":"{D3}","size":1,"platform":{{"os":"unknown","architecture":"unknown"}}}}]}}"#
        )
    }

    #[test]
    fn selects_platforms_and_skips_attestations() {
        let Parsed::Index(idx) = parse_manifest(&raw(&index(), None), "m").unwrap() else {
            panic!("an index")
        };
        assert_eq!(
            select_platforms(&idx, &Platforms::All, "m").unwrap(),
            [D1, D2]
        );
        let arm = Platforms::parse("linux/arm64").unwrap();
        assert_eq!(select_platforms(&idx, &arm, "m").unwrap(), [D2]);
        let err = select_platforms(&idx, &Platforms::parse("linux/s390x").unwrap(), "m")
            .unwrap_err()
            .to_string();
        assert!(err.contains("it has: linux/amd64, linux/arm64/v8"), "{err}");
    }

    #[test]
    fn manifests_by_type_or_shape() {
        let m = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"x","digest":"{D1}","size":3}},"layers":[{{"mediaType":"y","digest":"{D2}","size":5}}]}}"#
        );
        assert!(matches!(
            parse_manifest(&raw(&m, Some(IMAGE_MANIFEST_MEDIA_TYPE)), "m"),
            Ok(Parsed::Image(_))
        ));
        let Ok(Parsed::Image(parsed)) = parse_manifest(&raw(&m, None), "m") else {
            panic!("a manifest by shape")
        };
        let mut p = Progress::default();
        add_blobs(&mut p, &parsed, "m").unwrap();
        assert_eq!(p.blobs.keys().map(|b| b.size).sum::<u64>(), 8);
        let err = parse_manifest(
            &raw(
                "{}",
                Some("application/vnd.docker.distribution.manifest.v1+prettyjws"),
            ),
            "m",
        )
        .err()
        .unwrap();
        assert!(!err.retryable(), "{err}");
    }

    #[test]
    fn manifest_digest_checks() {
        let r = raw("{}", None);
        let actual = manifest_digest(&r, None, "m").unwrap();
        assert_eq!(
            actual,
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert!(manifest_digest(&r, Some(&actual), "m").is_ok());
        assert!(matches!(
            manifest_digest(&r, Some(D1), "m"),
            Err(FetchError::DigestMismatch { .. })
        ));
    }
}
