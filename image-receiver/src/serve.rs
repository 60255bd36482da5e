//! `runr-image-upload serve`: where the two halves meet. The upload half takes the file in and
//! verifies it; on `complete` it calls the processor built here, which is the image half's
//! pipeline with this upload's options.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::image::follow::{self, Streamed};
use crate::image::pipeline::{self, ProcessOptions};
use crate::upload::{server, OpenError, Processor, Upload};

/// Why `serve` could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The upload directory could not be used.
    #[error("cannot open the upload")]
    Open(#[from] OpenError),
    /// The port could not be bound.
    #[error("cannot listen on port {port}")]
    Bind {
        /// `PORT`.
        port: u16,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The signal handlers could not be installed.
    #[error("cannot install the SIGTERM handler")]
    Signal(#[source] std::io::Error),
}

/// `runr-image-upload serve`: opens the upload in `RUNR_UPLOAD_DIR` (taking over what a previous
/// run left), listens on `PORT` and serves until SIGTERM or SIGINT. Work that a previous run
/// had started (verifying, pushing) starts again.
pub async fn serve(config: Config) -> Result<(), ServeError> {
    let upload = Upload::open(&config.upload_dir, config.size, &config.sha256)?;
    let opts = process_options(&config, &upload);
    let processor = pipeline_processor(opts.clone());
    let listener = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], config.port)))
        .await
        .map_err(|source| ServeError::Bind {
            port: config.port,
            source,
        })?;
    let stop = runr_base::signal::shutdown().map_err(ServeError::Signal)?;
    let shutdown = async move {
        let signal = stop.await;
        tracing::info!("{signal}: shutting down");
    };
    // `addr=` first: tests (and operators) read the bound port from it.
    tracing::info!(
        addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        dir = %config.upload_dir.display(),
        size = config.size,
        target = %config.target,
        registry = ?config.registry,
        compress = ?config.compress,
        chunk_idle = %runr_base::env::display_duration(config.chunk_idle),
        "listening"
    );
    if !upload.is_finished() {
        // Its own handle on the data file: the upload writes through another.
        match std::fs::File::open(upload.data_path()) {
            Ok(file) => {
                tokio::spawn(follow::follow(Arc::new(file), config.size, opts.clone()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot follow the upload: everything is pushed after complete")
            }
        }
    }
    if upload.needs_resume() {
        tracing::info!("a previous run stopped while verifying or pushing: starting that again");
        upload.resume(processor.clone());
    }
    let prefix = upload.prefix();
    server::run(listener, upload, processor, config.chunk_idle, shutdown).await;
    // A follower waiting for bytes that will not come would hold the runtime's shutdown.
    prefix.stop();
    Ok(())
}

/// The options of this upload's pipeline: it counts its push into the upload's progress, and
/// its follower reads behind the upload's prefix.
fn process_options(config: &Config, upload: &Upload) -> Arc<ProcessOptions> {
    Arc::new(ProcessOptions {
        work_dir: config.upload_dir.clone(),
        target: config.target.clone(),
        upload_name: config.name.clone(),
        filename: config.filename.clone(),
        compress: config.compress,
        registry: config.registry.clone(),
        progress: upload.progress(),
        streamed: Arc::new(Streamed::new(upload.prefix())),
    })
}

/// The pipeline as the upload's [`Processor`].
fn pipeline_processor(opts: Arc<ProcessOptions>) -> Processor {
    Arc::new(move |file| {
        let opts = opts.clone();
        Box::pin(async move {
            let info = pipeline::process(&file, &opts)
                .await
                .map_err(|e| e.to_string())?;
            serde_json::to_value(info).map_err(|e| format!("internal error: {e}"))
        })
    })
}
