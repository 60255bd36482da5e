//! The one shutdown future of the wrapper.

use std::future::Future;

use tokio::signal::unix::{signal, SignalKind};

/// Resolves on the first SIGTERM or SIGINT. The handlers are installed when this is called (so
/// a signal arriving before the future is polled is not lost, and as PID 1 — where the kernel
/// drops signals without a handler — SIGTERM does reach us).
pub fn shutdown() -> std::io::Result<impl Future<Output = ()>> {
    // SIGTERM: Kubernetes (the kubelet) sends it on scale-down and for a new revision.
    let mut term = signal(SignalKind::terminate())?;
    // SIGINT: Ctrl-C while running the wrapper by hand.
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "shutdown requested"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "shutdown requested"),
        }
    })
}
