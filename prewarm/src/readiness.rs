//! Waiting for the registry to answer `GET /v2/`: at start (the Job may run while the registry
//! is still rolling out) and again whenever a request fails the way a restarting registry makes
//! requests fail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runr_registry::{Backoff, TlsFailure};

use crate::cache::{Cache, FetchError};

/// Pauses between two probes: short at first (a restart takes seconds), at most a few seconds.
const PROBE_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(200),
    max: Duration::from_secs(5),
};

/// The registry cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// It did not answer within the wait.
    #[error("the registry did not answer GET /v2/ within {}s (last: {last})", .wait.as_secs())]
    Timeout {
        /// The wait that ran out.
        wait: Duration,
        /// The last probe's outcome.
        last: String,
    },
    /// It answers, but the TLS handshake fails: a restart will not change the certificate or
    /// the CA prewarm was given, so this is not waited out.
    #[error("{0}")]
    Tls(TlsFailure),
}

/// Shared by all images: one probe loop at a time, and once the registry has been given up on,
/// every later check fails at once instead of waiting again.
pub struct Readiness {
    cache: Arc<Cache>,
    wait: Duration,
    state: tokio::sync::Mutex<State>,
}

struct State {
    /// When the registry last came back after a wait.
    back_at: Option<Instant>,
    /// Set once the wait ran out.
    gave_up: Option<NotReady>,
}

impl Readiness {
    /// Checks for `cache`, waiting up to `wait` each time.
    pub fn new(cache: Arc<Cache>, wait: Duration) -> Readiness {
        Readiness {
            cache,
            wait,
            state: tokio::sync::Mutex::new(State {
                back_at: None,
                gave_up: None,
            }),
        }
    }

    /// Waits until the registry answers (the start of the run).
    pub async fn initial(&self) -> Result<(), NotReady> {
        let mut st = self.state.lock().await;
        self.wait_locked(&mut st).await.map(|_| ())
    }

    /// Called after a failure that looks like the registry went away, by an attempt that
    /// started at `attempt_started`. `Ok(true)`: the registry was away and is back (the attempt
    /// was cut short by a restart); `Ok(false)`: it answers right away (the failure was the
    /// request's own).
    pub async fn recheck(&self, attempt_started: Instant) -> Result<bool, NotReady> {
        let mut st = self.state.lock().await;
        if let Some(gave_up) = &st.gave_up {
            return Err(gave_up.clone());
        }
        // Another image already waited it out since this attempt began.
        if st.back_at.is_some_and(|t| t > attempt_started) {
            return Ok(true);
        }
        if matches!(self.cache.ping().await, Ok(200 | 401)) {
            return Ok(false);
        }
        self.wait_locked(&mut st).await
    }

    /// Probes until 200 or 401, until the wait runs out, or until a TLS failure shows that waiting
    /// cannot help. `Ok(true)` when it had to wait.
    async fn wait_locked(&self, st: &mut State) -> Result<bool, NotReady> {
        let started = Instant::now();
        let mut probe = 0;
        loop {
            let last = match self.cache.ping().await {
                Ok(200 | 401) => {
                    if probe > 0 {
                        tracing::info!(
                            seconds = started.elapsed().as_secs_f64(),
                            "registry answers again"
                        );
                        st.back_at = Some(Instant::now());
                    }
                    return Ok(probe > 0);
                }
                // 502/503/504 come from a load balancer in front of a restarting registry;
                // anything else unexpected is waited out the same way.
                Ok(status) => format!("HTTP {status}"),
                Err(FetchError::Tls(tls)) => {
                    let err = NotReady::Tls(tls);
                    tracing::error!(error = %err, "giving up on the registry");
                    st.gave_up = Some(err.clone());
                    return Err(err);
                }
                Err(FetchError::Connect { cause, .. }) => cause,
                Err(e) => e.to_string(),
            };
            let left = self.wait.saturating_sub(started.elapsed());
            if left.is_zero() {
                let err = NotReady::Timeout {
                    wait: self.wait,
                    last,
                };
                tracing::error!(error = %err, "giving up on the registry");
                st.gave_up = Some(err.clone());
                return Err(err);
            }
            if probe == 0 {
                tracing::info!(
                    reason = %last,
                    wait_s = self.wait.as_secs(),
                    "waiting for the registry to answer GET /v2/"
                );
            } else {
                tracing::debug!(reason = %last, "registry not answering yet");
            }
            tokio::time::sleep(PROBE_BACKOFF.delay(probe).min(left)).await;
            probe += 1;
        }
    }
}
