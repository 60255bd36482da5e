//! The one-thread tokio runtime that the wrapper, tick and the queue consumer run on. Prewarm
//! builds its own (after a signal it must not wait for a DNS lookup left on a blocking thread),
//! and the receiver needs two threads (one receives while the other hashes or pushes).

use std::future::Future;

/// Runs `work` to completion on a new current-thread runtime with I/O and timers, or logs why
/// the runtime could not start and returns `None` (the caller picks its exit status).
pub fn block_on<F: Future>(work: F) -> Option<F::Output> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt.block_on(work)),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_the_future_with_timers() {
        let out = super::block_on(async {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            7
        });
        assert_eq!(out, Some(7));
    }
}
