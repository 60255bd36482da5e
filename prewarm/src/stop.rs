//! Stopping on SIGTERM (Kubernetes: the Job's `activeDeadlineSeconds`, its deletion, a node
//! drain) or SIGINT (Ctrl-C by hand): the run stops starting transfers, every image not finished
//! yet fails with the signal as its error (what was already confirmed is kept), and the summary
//! is printed as usual. A stalled transfer is dropped, not waited for.

use std::fmt;
use std::time::Duration;

use runr_base::signal::Stop;
use tokio::sync::watch;

/// The run was stopped by a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terminated {
    /// Which one.
    pub signal: Stop,
    /// When it came, from the start of the run.
    pub after: Duration,
}

impl fmt::Display for Terminated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "terminated by {} after {} s",
            self.signal,
            self.after.as_secs()
        )
    }
}

/// What every image watches: `None` until a signal came.
pub type StopWatch = watch::Receiver<Option<Terminated>>;

/// Resolves once the run is stopped; never, if the sending side is gone without a signal (the
/// run is over then anyway).
pub async fn stopped(watch: &mut StopWatch) -> Terminated {
    loop {
        if let Some(t) = *watch.borrow_and_update() {
            return t;
        }
        if watch.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_names_the_signal_and_the_time() {
        let t = Terminated {
            signal: Stop::Term,
            after: Duration::from_millis(12_700),
        };
        assert_eq!(t.to_string(), "terminated by SIGTERM after 12 s");
        let t = Terminated {
            signal: Stop::Int,
            after: Duration::ZERO,
        };
        assert_eq!(t.to_string(), "terminated by SIGINT after 0 s");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn watchers_wake_when_it_is_sent() {
        let (tx, mut rx) = watch::channel(None);
        let t = Terminated {
            signal: Stop::Term,
            after: Duration::from_secs(3),
        };
        let waiter = tokio::spawn(async move { stopped(&mut rx).await });
        tx.send_replace(Some(t));
        assert_eq!(waiter.await.unwrap(), t);
    }
}
