//! One invocation, from its request's head to the moment it is observed. [`Invocation`] owns
//! the request, its deadline and the answer when that deadline passes, its server span and
//! the tag of its handler's log lines, the admission slot and the bytes it holds, and the body
//! still on the connection when the handler takes it as it arrives. [`Invocation::finish`] is
//! the one place where an invocation is observed: metrics, the invocation line, the access
//! line and span, replay capture.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::time::Instant;

use super::budget::Held;
use super::outcome::{failure_of, Ended, Outcome};
use crate::observe::logs::{self, InvocationLine, Tag};
use crate::observe::metrics::{self, Invocation as Counted};
use crate::observe::trace::{self, Span};
use crate::observe::{self, Finished};
use crate::process::reaper::Exit;
use crate::request::body::{BodyError, BodyReader};
use crate::request::Request;
use crate::response::ErrorClass;

/// How a client reached the function (lambda mode's event says it).
#[derive(Debug, Clone, Copy)]
pub struct Client {
    /// The peer address of its connection.
    pub peer: SocketAddr,
    /// The HTTP version it spoke.
    pub version: http::Version,
}

/// One invocation under way.
pub struct Invocation {
    req: Arc<Request>,
    arrived: Instant,
    /// `RUNR_TIMEOUT`: the deadline is `arrived + timeout`, and the 504 names it.
    timeout: Duration,
    /// `None` for the schedule one-shot, which has no client and prints a whole answer.
    client: Option<Client>,
    /// The server span, when tracing is on.
    span: Option<Span>,
    /// The client's own `traceparent`, which the handler's copy of the request no longer has.
    client_traceparent: Option<HeaderValue>,
    /// Decided when the handler gets the request ([`Invocation::begin`]), so that the first
    /// request invoked is the cold one (not one refused before it).
    cold_start: Option<bool>,
    /// The body still on the connection, when the handler takes it as it arrives.
    body: Option<BodyReader>,
    /// The admission slot, held while the invocation occupies a handler.
    slot: Option<Box<dyn Send>>,
    /// Bytes of `RUNR_MAX_INFLIGHT_BYTES` held for it.
    held: Held,
}

impl Invocation {
    /// The invocation of `req` (its head; the body comes later), which arrived at `arrived`
    /// and times out `timeout` later. The handler gets the deadline (`RUNR_DEADLINE_MS`,
    /// `deadlineMs`) and, with tracing on, a `traceparent` whose parent is the wrapper's span,
    /// as the observed proxy does for http mode: both are set here, before exec mode checks
    /// that the variables fit.
    pub fn new(
        mut req: Request,
        arrived: Instant,
        timeout: Duration,
        client: Option<Client>,
    ) -> Invocation {
        req.deadline_ms = Some(deadline_ms(arrived + timeout));
        let span = observe::global().and_then(|o| o.start_span(&req.headers, SystemTime::now()));
        let client_traceparent = match &span {
            Some(span) => {
                let theirs = req.headers.get(trace::TRACEPARENT).cloned();
                if let Ok(v) = HeaderValue::from_str(&span.traceparent()) {
                    req.headers.insert(trace::TRACEPARENT, v);
                }
                theirs
            }
            None => None,
        };
        Invocation {
            req: Arc::new(req),
            arrived,
            timeout,
            client,
            span,
            client_traceparent,
            cold_start: None,
            body: None,
            slot: None,
            held: Held::unlimited(),
        }
    }

    /// The request.
    pub fn request(&self) -> &Arc<Request> {
        &self.req
    }

    /// When it arrived.
    pub fn arrived(&self) -> Instant {
        self.arrived
    }

    /// When it times out: waiting for a slot, reading the body and the handler's run all count.
    pub fn deadline(&self) -> Instant {
        self.arrived + self.timeout
    }

    /// `RUNR_TIMEOUT`.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The 504 of an invocation whose time ran out.
    pub fn timed_out(&self) -> Outcome {
        Outcome::timed_out(self.timeout)
    }

    /// The client, `None` for the schedule one-shot.
    pub fn client(&self) -> Option<Client> {
        self.client
    }

    /// Whether its answer may reach the client as the handler streams it (not the schedule
    /// one-shot, which prints one whole answer).
    pub fn may_stream(&self) -> bool {
        self.client.is_some()
    }

    /// True when a server span was started (tracing on).
    pub fn traced(&self) -> bool {
        self.span.is_some()
    }

    /// Body bytes a replay capture keeps of its request (0 without replay).
    pub fn keep(&self) -> usize {
        observe::global()
            .and_then(|o| o.replay_max_body())
            .unwrap_or(0)
    }

    /// Admitted: `slot` is held while a handler runs it, `held` (the bytes reserved for it)
    /// until its answer has been written.
    pub fn admitted(&mut self, slot: impl Send + 'static, held: Held) {
        self.slot = Some(Box::new(slot));
        self.held = held;
    }

    /// The admission slot, for a mode that keeps it beyond the answer (lambda mode: as long as
    /// a runtime is busy with the invocation).
    pub fn take_slot(&mut self) -> Option<Box<dyn Send>> {
        self.slot.take()
    }

    /// The bytes held for it, to grow by what it collects.
    pub fn held(&mut self) -> &mut Held {
        &mut self.held
    }

    /// Reads the whole body by the deadline into the request; `reserved` bytes of body were
    /// reserved `factor` times over ([`super::Invoker::holds`]), and what the body turned out
    /// not to need goes back.
    pub async fn read_body(
        &mut self,
        mut body: BodyReader,
        declared: Option<u64>,
        reserved: u64,
        factor: u64,
    ) -> Result<(), BodyError> {
        let whole = match tokio::time::timeout_at(self.deadline(), body.read_whole(declared)).await
        {
            Ok(whole) => whole?,
            Err(_elapsed) => return Err(BodyError::TimedOut),
        };
        let surplus = reserved.saturating_sub(whole.len() as u64);
        self.held.release(surplus * factor);
        // Not shared before the invocation runs: no copy is made.
        Arc::make_mut(&mut self.req).set_body(whole);
        Ok(())
    }

    /// Leaves the body on the connection for the handler to take as it arrives.
    pub fn stream_body(&mut self, body: BodyReader) {
        self.body = Some(body);
    }

    /// The body still on the connection (when it streams) and the bytes held, together.
    pub fn body_and_held(&mut self) -> (Option<&mut BodyReader>, &mut Held) {
        (self.body.as_mut(), &mut self.held)
    }

    /// Marks the moment the handler gets the request (after admission and the body).
    pub fn begin(&mut self) {
        if self.span.is_some() {
            self.cold_start = Some(trace::take_cold_start());
        }
    }

    /// What the handler's log lines carry: its request id, and its trace when tracing is on.
    pub fn tag(&self) -> Tag {
        Tag {
            request_id: Arc::from(self.req.id.as_str()),
            trace_id: self.span.as_ref().map(|s| Arc::from(s.trace_id_hex())),
        }
    }

    /// The invocation is over with `outcome`: counted in the metrics, written in the
    /// invocation line and, as configured, the access line, span and replay capture.
    pub fn finish(self, outcome: &Outcome) {
        let took = self.arrived.elapsed();
        let req = &self.req;
        let class = outcome.class();
        let status = outcome.reply.status.as_u16();
        if outcome.ended == Ended::Refused {
            // A raw body streamed into the handler turned out too large, broken or late: the
            // client's request was refused (the handler was stopped), as if before it ran.
            if outcome.reply.status == StatusCode::PAYLOAD_TOO_LARGE {
                metrics::get().rejected(metrics::Rejected::BodyTooLarge);
            }
        } else {
            metrics::get().invocation(Counted {
                trigger: req.trigger,
                status,
                took,
                error: class,
                cold_start: outcome.cold_start,
            });
        }
        logs::invocation(&InvocationLine {
            request_id: &req.id,
            trigger: req.trigger.as_str(),
            status,
            took,
            error: class.map(ErrorClass::as_str),
            exit_status: outcome.exit.map(Exit::code),
            peak_rss_kib: outcome.peak_rss_kib,
            replaced_request_id: req.replaced_id.as_deref(),
        });
        let Some(observer) = observe::global() else {
            return;
        };
        let failure = failure_of(outcome);
        let mut span = self.span;
        if let Some(s) = span.as_mut() {
            // The span covers the whole invocation, from the request's arrival (`took`
            // counts the wait and the body read that came before the span was started).
            s.start = SystemTime::now() - took;
        }
        // A capture shows what the client sent, so its traceparent goes back in.
        let client_headers;
        let headers = match (&span, failure, observer.replay_max_body().is_some()) {
            (Some(_), Some(_), true) => {
                client_headers = with_traceparent(&req.headers, self.client_traceparent);
                &client_headers
            }
            _ => &req.headers,
        };
        let body = match &self.body {
            Some(streamed) => (streamed.kept(), streamed.seen()),
            None => (&req.body[..], req.body.len() as u64),
        };
        observer.finish(Finished {
            span,
            cold_start: self.cold_start.unwrap_or_else(trace::take_cold_start),
            ..Finished::new(req, headers, body, status, took, failure)
        });
    }
}

/// `headers` with their `traceparent` set back to `theirs` (removed when they had none).
fn with_traceparent(headers: &HeaderMap, theirs: Option<HeaderValue>) -> HeaderMap {
    let mut h = headers.clone();
    match theirs {
        Some(tp) => h.insert(trace::TRACEPARENT, tp),
        None => h.remove(trace::TRACEPARENT),
    };
    h
}

/// `deadline` in Unix epoch milliseconds (`deadlineMs`, `RUNR_DEADLINE_MS`).
pub fn deadline_ms(deadline: Instant) -> u64 {
    let left = deadline.saturating_duration_since(Instant::now());
    runr_base::fmt::unix_millis(SystemTime::now() + left)
}
