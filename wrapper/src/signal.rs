//! The one shutdown future of the wrapper: [`runr_base::signal::shutdown`], with the line that
//! says which signal asked.

use std::future::Future;

/// Resolves on the first SIGTERM (the kubelet: scale-down, a new revision) or SIGINT (Ctrl-C by
/// hand). The handlers are installed when this is called (see [`runr_base::signal::shutdown`]).
pub fn shutdown() -> std::io::Result<impl Future<Output = ()>> {
    let stop = runr_base::signal::shutdown()?;
    Ok(async move {
        let signal = stop.await;
        tracing::info!(signal = ?signal.name(), "shutdown requested");
    })
}
