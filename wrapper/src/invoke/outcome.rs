//! What one invocation came to: the answer ([`Outcome`]) and what happened to the handler
//! ([`Ended`]), whatever mode ran it.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;

use super::budget::Held;
use super::lambda::StreamedBody;
use crate::observe::Failure;
use crate::process::reaper::Exit;
use crate::response::{ErrorClass, Reply};

/// Largest handler output (exec stdout, or one persistent response line) we answer with.
pub const MAX_OUTPUT: usize = 10 * 1024 * 1024;

/// What happened to the handler during one invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The handler answered (whatever status it chose).
    Answered,
    /// Exec mode: it exited non-zero without a response envelope; the status (128 + signal for
    /// a signal).
    ExitStatus(i32),
    /// The command could not be started.
    FailedToStart,
    /// It ran into the timeout (waiting for a worker included) and was killed.
    TimedOut,
    /// Persistent mode: the worker exited while handling the request.
    WorkerExited,
    /// It wrote more than [`MAX_OUTPUT`].
    OutputTooLarge,
    /// No worker can take requests any more (shutting down).
    Unavailable,
    /// The request body, streamed into the handler, turned out too large, broken or late: the
    /// handler was killed and the client answered 413, 400 or 408.
    Refused,
}

impl Ended {
    /// The `X-RunR-Error` class of the wrapper's answer when the handler did not answer.
    pub fn class(self) -> Option<ErrorClass> {
        match self {
            Ended::Answered => None,
            Ended::ExitStatus(_) | Ended::WorkerExited => Some(ErrorClass::Crash),
            Ended::FailedToStart => Some(ErrorClass::Start),
            Ended::TimedOut => Some(ErrorClass::Timeout),
            Ended::OutputTooLarge => Some(ErrorClass::Limit),
            Ended::Unavailable => Some(ErrorClass::Unavailable),
            // The body's own answer says (413: limit; 400, 408: request).
            Ended::Refused => None,
        }
    }
}

/// One invocation's result.
#[derive(Debug)]
pub struct Outcome {
    /// The HTTP answer.
    pub reply: Reply,
    /// What happened.
    pub ended: Ended,
    /// The first invocation of the process that ran it (exec mode: of the wrapper; persistent
    /// mode: of the worker).
    pub cold_start: bool,
    /// How the handler process ended, when it did during the invocation.
    pub exit: Option<Exit>,
    /// Exec mode: the handler's peak resident set in KiB (from `wait4`).
    pub peak_rss_kib: Option<u64>,
    /// The answer's body as a runtime streams it (lambda mode), `reply` being its head; `None`
    /// when `reply` is the whole answer.
    pub stream: Option<StreamedBody>,
    /// The bytes of `RUNR_MAX_INFLIGHT_BYTES` the answer holds until it has been written.
    pub held: Held,
}

impl Outcome {
    /// The handler answered with `reply`.
    pub fn answered(reply: Reply) -> Outcome {
        Outcome {
            reply,
            ended: Ended::Answered,
            cold_start: false,
            exit: None,
            peak_rss_kib: None,
            stream: None,
            held: Held::unlimited(),
        }
    }

    /// A wrapper-made `{"error": ...}` answer, marked with the class of `ended`.
    pub fn failed(ended: Ended, status: StatusCode, message: &str) -> Outcome {
        let reply = match ended.class() {
            Some(class) => Reply::failure(class, status, message),
            None => Reply::error(status, message),
        };
        Outcome {
            ended,
            ..Outcome::answered(reply)
        }
    }

    /// The class of the wrapper's answer, `None` when the handler answered itself.
    pub fn class(&self) -> Option<ErrorClass> {
        self.ended.class().or_else(|| self.reply.error_class())
    }

    /// 504 `handler timed out after Ns` ([`Reply::timed_out`]).
    pub fn timed_out(timeout: Duration) -> Outcome {
        Outcome {
            ended: Ended::TimedOut,
            ..Outcome::answered(Reply::timed_out(timeout))
        }
    }

    /// 502 for output above [`MAX_OUTPUT`].
    pub fn output_too_large() -> Outcome {
        Outcome::failed(
            Ended::OutputTooLarge,
            StatusCode::BAD_GATEWAY,
            "handler output exceeds 10 MiB",
        )
    }

    /// A streamed answer as it ended: its head's `status`, what happened to the handler by the
    /// end of its body.
    pub fn streamed(status: StatusCode, ended: Ended) -> Outcome {
        Outcome {
            ended,
            ..Outcome::answered(Reply {
                status,
                headers: Vec::new(),
                body: Bytes::new(),
            })
        }
    }

    /// The answer to a request body that failed while it was streamed into the handler.
    pub fn refused(reply: Reply) -> Outcome {
        Outcome {
            ended: Ended::Refused,
            ..Outcome::answered(reply)
        }
    }

    /// 500 `handler failed to start`.
    pub fn failed_to_start() -> Outcome {
        Outcome::failed(
            Ended::FailedToStart,
            StatusCode::INTERNAL_SERVER_ERROR,
            "handler failed to start",
        )
    }
}

/// How an invocation failed, if it did (what spans and replay capture record).
pub fn failure_of(outcome: &Outcome) -> Option<Failure> {
    match outcome.ended {
        Ended::TimedOut => Some(Failure::Timeout),
        Ended::ExitStatus(_) | Ended::FailedToStart | Ended::WorkerExited => Some(Failure::Crash),
        Ended::Refused => None,
        Ended::Answered | Ended::OutputTooLarge | Ended::Unavailable => {
            (outcome.reply.status.as_u16() >= 500).then_some(Failure::Status)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_way_the_handler_did_not_answer_has_its_class() {
        use crate::response::ERROR_HEADER;
        let cases = [
            (Ended::TimedOut, "timeout"),
            (Ended::ExitStatus(3), "crash"),
            (Ended::WorkerExited, "crash"),
            (Ended::FailedToStart, "start"),
            (Ended::OutputTooLarge, "limit"),
            // What a persistent request gets when the pool is gone (shutting down).
            (Ended::Unavailable, "unavailable"),
        ];
        for (ended, class) in cases {
            let o = Outcome::failed(ended, StatusCode::BAD_GATEWAY, "x");
            assert_eq!(o.class().map(ErrorClass::as_str), Some(class));
            let header: Vec<_> = o
                .reply
                .headers
                .iter()
                .filter(|(n, _)| *n == ERROR_HEADER)
                .map(|(_, v)| v.to_str().unwrap())
                .collect();
            assert_eq!(header, [class]);
        }
        let answered = Outcome::answered(Reply::error(StatusCode::INTERNAL_SERVER_ERROR, "own"));
        assert_eq!(answered.class(), None);
        assert!(answered
            .reply
            .headers
            .iter()
            .all(|(n, _)| *n != ERROR_HEADER));
    }
}
