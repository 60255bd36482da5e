//! The one shutdown future of every binary.

use std::fmt;
use std::future::Future;

use tokio::signal::unix::{signal, SignalKind};

/// The signal that asked us to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM: the kubelet stopping the pod (scale-down, a new revision, a Job's deadline or
    /// deletion, a node drain).
    Term,
    /// SIGINT: Ctrl-C while running a binary by hand.
    Int,
}

impl Stop {
    /// `SIGTERM` or `SIGINT`.
    pub fn name(self) -> &'static str {
        match self {
            Stop::Term => "SIGTERM",
            Stop::Int => "SIGINT",
        }
    }

    /// The conventional exit status of a process killed by this signal (128 + signo).
    pub fn exit_status(self) -> u8 {
        match self {
            Stop::Term => 143,
            Stop::Int => 130,
        }
    }
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Resolves with the first SIGTERM or SIGINT. The handlers are installed when this is called
/// (inside a tokio runtime), so a signal arriving before the future is polled is not lost, and
/// as PID 1 (where the kernel drops signals that have no handler) SIGTERM does reach us.
pub fn shutdown() -> std::io::Result<impl Future<Output = Stop> + Send + 'static> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => Stop::Term,
            _ = int.recv() => Stop::Int,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_statuses() {
        assert_eq!(Stop::Term.to_string(), "SIGTERM");
        assert_eq!(Stop::Int.name(), "SIGINT");
        assert_eq!(Stop::Term.exit_status(), 143);
        assert_eq!(Stop::Int.exit_status(), 130);
    }

    #[tokio::test]
    async fn a_real_sigterm_resolves_the_future() {
        let stop = shutdown().unwrap();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), stop)
            .await
            .expect("SIGTERM seen");
        assert_eq!(got, Stop::Term);
    }
}
