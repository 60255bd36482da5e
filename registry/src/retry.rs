//! Retry policy: which registry failures are transient, and exponential backoff with jitter.

use std::time::Duration;

use oci_client::errors::OciDistributionError;

/// True for failures another attempt may cure: connection errors and timeouts, 5xx, 429 (and
/// 408). A 4xx other than those is the registry's final word, and a failed TLS handshake (an
/// unknown CA, a certificate for another name, expired or not valid yet) is a configuration
/// error however often it is retried.
pub fn is_transient(err: &OciDistributionError) -> bool {
    if crate::failure::TlsFailure::find("", err).is_some() {
        return false;
    }
    match err {
        OciDistributionError::RequestError(e) => {
            e.is_connect()
                || e.is_timeout()
                || e.is_request()
                || e.is_body()
                || e.status().is_some_and(|s| is_transient_status(s.as_u16()))
        }
        OciDistributionError::ServerError { code, .. } => is_transient_status(*code),
        OciDistributionError::IoError(_) => true,
        _ => false,
    }
}

/// True for HTTP statuses worth retrying.
pub fn is_transient_status(code: u16) -> bool {
    code >= 500 || code == 429 || code == 408
}

/// The registry clients' retry wait: runr-base's one backoff (exponential, equal jitter: attempt
/// `n` waits a random time in `[base·2ⁿ/2, base·2ⁿ]`, capped at `max`), counted from 0.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The first delay's upper bound.
    pub base: Duration,
    /// The largest delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(500),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0 for the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        runr_base::backoff::Backoff::new(self.base, self.max).delay(attempt.saturating_add(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_stay_bounded() {
        let b = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        for attempt in 0..40 {
            let d = b.delay(attempt);
            let upper = Duration::from_millis(100 * (1u64 << attempt.min(20))).min(b.max);
            assert!(d >= upper / 2 && d <= upper, "attempt {attempt}: {d:?}");
        }
    }

    #[test]
    fn statuses() {
        for code in [500, 502, 503, 504, 429, 408] {
            assert!(is_transient_status(code), "{code}");
        }
        for code in [400, 401, 403, 404, 416] {
            assert!(!is_transient_status(code), "{code}");
        }
    }
}
