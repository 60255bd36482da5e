//! The record of a finished invocation that every observer reads.

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use super::trace::Span;
use crate::request::Request;

/// One finished invocation, whatever mode ran it: what the client sent (as far as it is kept),
/// what it was answered, how long it took and whether it failed. The access line, the exported
/// span and the replay capture are all written from it.
#[derive(Debug)]
pub struct Finished<'a> {
    /// The server span, when tracing is on.
    pub span: Option<Span>,
    /// `http`, `queue` or `schedule`.
    pub trigger: &'a str,
    /// Request method.
    pub method: &'a str,
    /// Path without the query.
    pub path: &'a str,
    /// Raw query string.
    pub query: &'a str,
    /// Request headers (what the client sent).
    pub headers: &'a HeaderMap,
    /// The request body as far as it is kept.
    pub body: &'a [u8],
    /// The request body's full size.
    pub body_size: u64,
    /// The status answered.
    pub status: u16,
    /// Time from the request's arrival to its end.
    pub took: Duration,
    /// Set when the invocation failed.
    pub failure: Option<Failure>,
    /// First request of the process.
    pub cold_start: bool,
    /// When the wrapper gave the request an id of its own in place of the client's unusable
    /// `X-Request-Id`: that id, and the start of what the client sent.
    pub replaced_id: Option<(&'a str, &'a str)>,
}

impl<'a> Finished<'a> {
    /// `req` answered with `status` after `took`, `failure` when it failed; `headers` are the
    /// request's as the client sent them, `body` the body as far as it is kept and its full
    /// size. No span, not the cold start: set those with the struct update syntax.
    pub fn new(
        req: &'a Request,
        headers: &'a HeaderMap,
        body: (&'a [u8], u64),
        status: u16,
        took: Duration,
        failure: Option<Failure>,
    ) -> Finished<'a> {
        Finished {
            span: None,
            trigger: req.trigger.as_str(),
            method: &req.method,
            path: &req.path,
            query: &req.raw_query,
            headers,
            body: body.0,
            body_size: body.1,
            status,
            took,
            failure,
            cold_start: false,
            replaced_id: req.replaced_id.as_deref().map(|r| (req.id.as_str(), r)),
        }
    }

    /// When the request arrived: the span's start, else now minus the time it took.
    pub fn arrived(&self) -> SystemTime {
        self.span
            .as_ref()
            .map_or_else(|| SystemTime::now() - self.took, |s| s.start)
    }
}

/// Why an invocation counts as failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// It was answered with a status of 500 or more.
    Status,
    /// It ran into the timeout.
    Timeout,
    /// The handler crashed: exited without an answer, failed to start, or the upstream
    /// connection broke.
    Crash,
}

impl Failure {
    /// The name in the capture's `failure` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Status => "status",
            Failure::Timeout => "timeout",
            Failure::Crash => "crash",
        }
    }
}
