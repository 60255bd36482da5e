//! `runr-prewarm`: makes a region registry's pull-through cache fetch and store base images
//! before the first function build needs them.
//!
//! The run: wait for `GET /v2/` ([`readiness`]), then per image ([`image`]) resolve the
//! reference once, fetch the selected platforms' manifests by digest and warm every blob through
//! the shared largest-first queue ([`blobs`]), ending with Range probes that confirm the cache
//! holds each blob. Requests and their classification live in [`cache`]; the variables in
//! [`config`]; the per-image reports and the JSON summary in [`summary`]; what SIGTERM and
//! SIGINT do in [`stop`].

#![forbid(unsafe_code)]

pub mod blobs;
pub mod cache;
pub mod config;
pub mod image;
pub mod readiness;
pub mod stop;
pub mod summary;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use futures_util::future::join_all;
use runr_base::log::LogFormat;
use runr_base::signal::Stop;

pub use config::Config;
pub use summary::Summary;

/// prewarm's log lines on stderr (stdout carries only the JSON summary): prefixed, INFO named
/// like every other level, no timestamps since the Job's log collector adds its own.
pub const LOG_FORMAT: LogFormat = LogFormat {
    prefix: "runr-prewarm",
    info_level: true,
    timestamps: false,
};

/// The client could not be set up from the configuration (e.g. a malformed CA file).
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the registry client (is RUNR_REGISTRY_CA_FILE a PEM file?): {0}")]
pub struct SetupError(#[from] pub runr_registry::ClientError);

/// Warms every configured image and returns the summary. When `shutdown` resolves (SIGTERM or
/// SIGINT, see [`stop`]), no new transfer starts, every unfinished image fails with the signal
/// as its error, and the summary of what was done so far is returned at once.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = Stop>,
) -> Result<Summary, SetupError> {
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
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(None);
    let shared = image::Shared {
        fetcher: blobs::Fetcher::new(Arc::clone(&cache)),
        readiness: readiness::Readiness::new(Arc::clone(&cache), config.wait),
        manifest_slots: tokio::sync::Semaphore::new(config.concurrency),
        stop: stop_rx,
        cache,
        config,
    };
    let work = async {
        let mut stop = shared.stop.clone();
        let ready = tokio::select! {
            biased;
            ready = shared.readiness.initial() => ready.map_err(|e| e.to_string()),
            t = stop::stopped(&mut stop) => {
                Err(format!("{t} while waiting for the registry to answer GET /v2/"))
            }
        };
        match ready {
            Ok(()) => {
                // Dropped (the workers aborted, their transfers with them) once every image
                // has its report.
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
            Err(error) => shared
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
                    error: Some(error.clone()),
                })
                .collect(),
        }
    };
    // Never finishes: it tells everyone and lets `work` end with the reports.
    let on_signal = async {
        let signal = shutdown.await;
        let t = stop::Terminated {
            signal,
            after: started.elapsed(),
        };
        tracing::warn!(
            signal = %signal,
            seconds = t.after.as_secs_f64(),
            "stopping: no new transfers, unfinished images fail, the summary follows"
        );
        shared.fetcher.stop();
        stop_tx.send_replace(Some(t));
        std::future::pending::<std::convert::Infallible>().await
    };
    let reports = tokio::select! {
        biased;
        reports = work => reports,
        never = on_signal => match never {},
    };
    Ok(Summary::new(
        &shared.config.registry,
        reports,
        started.elapsed().as_secs_f64(),
    ))
}
