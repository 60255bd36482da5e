//! `runr-prewarm`: makes a region registry's pull-through cache fetch and store base images
//! before the first function build needs them.
//!
//! The run: wait for `GET /v2/` ([`readiness`]), then per image ([`image`]) resolve the
//! reference once, fetch the selected platforms' manifests by digest and warm every blob through
//! the shared largest-first queue ([`blobs`]), ending with Range probes that confirm the cache
//! holds each blob. Requests and their classification live in [`cache`]; the variables in
//! [`config`]; the per-image reports and the JSON summary in [`summary`].

#![forbid(unsafe_code)]

pub mod blobs;
pub mod cache;
pub mod config;
pub mod image;
pub mod readiness;
pub mod summary;

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::join_all;
use runr_base::log::LogFormat;

pub use config::Config;
pub use runr_base::EXIT_CONFIG;
pub use summary::Summary;

/// prewarm's log lines on stderr (stdout carries only the JSON summary): prefixed, INFO named
/// like every other level, no timestamps since the Job's log collector adds its own.
pub const LOG_FORMAT: LogFormat = LogFormat {
    prefix: "runr-prewarm",
    info_level: true,
    timestamps: false,
};

/// Every image was warmed.
pub const EXIT_OK: u8 = 0;
/// At least one image failed; the next region:reconcile starts the Job again.
pub const EXIT_FAILED: u8 = 1;

/// The client could not be set up from the configuration (e.g. a malformed CA file).
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the registry client (is RUNR_REGISTRY_CA_FILE a PEM file?): {0}")]
pub struct SetupError(#[from] pub runr_registry::ClientError);

/// Warms every configured image and returns the summary.
pub async fn run(config: Config) -> Result<Summary, SetupError> {
    let started = Instant::now();
    let cache = Arc::new(cache::Cache::new(&config.registry, &config.access)?);
    tracing::info!(
        registry = %config.registry,
        images = config.images.len(),
        platforms = %config.platforms,
        attempts = config.attempts,
        concurrency = config.concurrency,
        wait_s = config.wait.as_secs(),
        timeout_s = config.timeout.as_secs(),
        plain_http = config.access.plain_http,
        "prewarm starting"
    );
    let shared = image::Shared {
        fetcher: blobs::Fetcher::new(Arc::clone(&cache)),
        readiness: readiness::Readiness::new(Arc::clone(&cache), config.wait),
        manifest_slots: tokio::sync::Semaphore::new(config.concurrency),
        cache,
        config,
    };
    let reports = match shared.readiness.initial().await {
        Ok(()) => {
            let _workers = shared.fetcher.spawn_workers(shared.config.concurrency);
            join_all(
                shared
                    .config
                    .images
                    .iter()
                    .map(|i| image::warm_image(&shared, i)),
            )
            .await
        }
        Err(not_ready) => shared
            .config
            .images
            .iter()
            .map(|i| summary::ImageReport {
                image: i.text.clone(),
                status: summary::Status::Failed,
                digest: None,
                blobs: 0,
                bytes: 0,
                fetched_bytes: 0,
                seconds: 0.0,
                attempts: 0,
                error: Some(not_ready.to_string()),
            })
            .collect(),
    };
    Ok(Summary::new(
        &shared.config.registry,
        reports,
        started.elapsed().as_secs_f64(),
    ))
}
