//! The observed proxy of http mode (tracing, replay or metrics on): the program listens on
//! `RUNR_UPSTREAM_PORT`, the wrapper on `$PORT`, and every request and response streams through
//! the wrapper, which adds the server span, the access line, the replay capture and the
//! metrics; its own answers (not listening yet, broken connection, timeout) carry
//! `X-RunR-Error`, and the program's never do: the header is removed from them (head and
//! trailers), so a consumer can trust it.
//!
//! Bodies are never held whole: frames go through as they come (a request of any size reaches
//! the program while its first bytes are still arriving), only the first `RUNR_REPLAY_MAX_BODY`
//! bytes of a request body are kept aside for a capture. Each client connection gets its own
//! upstream connection, reused for the next request on it, so keep-alive holds end to end
//! without a pool. Probes, CORS preflights and the SIGTERM drain are handled as in exec mode.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, ACCESS_CONTROL_ALLOW_ORIGIN};
use http::{HeaderMap, Method, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::body::{Body, Frame, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use runr_tick::Target;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use super::linger::{Linger, Unread};
use super::{direct, into_response, is_probe, preflight, serve_connections};
use crate::config::Config;
use crate::observe::metrics::{self, Held, Invocation};
use crate::observe::trace::{self, Span};
use crate::observe::{self, logs, Failure, Finished, Observer};
use crate::request::trigger::TriggerRule;
use crate::request::Request;
use crate::response::{self, ErrorClass, Reply, ERROR_HEADER};

/// Headers that belong to one connection and are not forwarded (RFC 9110 §7.6.1); hyper sets
/// the framing (`Content-Length` or chunked) of each side itself.
/// (Typed names: removing by `&str` would parse each name on every request.)
const HOP_BY_HOP: [HeaderName; 8] = [
    http::header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    http::header::TE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
    http::header::PROXY_AUTHENTICATE,
];

/// The body sent to the program: the client's, with a copy of its start kept for replay.
type UpBody = TeeBody;
/// The body sent to the client: a wrapper-made answer or the program's, observed to its end.
type DownBody = Either<Full<Bytes>, ObservedBody>;

/// What every request shares.
struct Ctx {
    /// Tracing and replay, when on (the proxy may run for metrics alone).
    observer: Option<&'static Observer>,
    upstream: Target,
    ready: watch::Receiver<bool>,
    ready_deadline: Instant,
    timeout: Duration,
    rule: TriggerRule,
}

/// Runs the observed proxy until `shutdown` (then drains and stops the program) or until the
/// program exits; returns the exit status. The observer, the reaper and the signal handlers are
/// the caller's ([`crate::commands`]).
pub async fn run(config: &Config, shutdown: impl Future<Output = ()>) -> u8 {
    let observer = observe::global();
    if observer.is_none() && config.telemetry.metrics_port.is_none() {
        tracing::error!(
            "the observed proxy needs RUNR_TRACING=1, RUNR_REPLAY=1 or RUNR_METRICS_PORT"
        );
        return 1;
    }
    let rule = TriggerRule::of_config(config);
    metrics::get().configure(rule.usual(), false);
    if let Some(port) = config.telemetry.metrics_port {
        if let Err(e) = super::metrics::start(port).await {
            tracing::error!(port, error = %e, "cannot listen on RUNR_METRICS_PORT");
            return 1;
        }
    }
    let listener = match super::bind(config.port).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(port = config.port, error = %e, "cannot listen");
            return 1;
        }
    };
    let upstream_port = config.observe.upstream_port;
    // With JSON logs the program's lines are wrapped as handler lines (no request id: its
    // requests run concurrently in one process); otherwise they pass straight through.
    let mut program = match direct::spawn_server(&config.command, upstream_port, logs::json()) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(command = ?config.command, error = %e, "cannot start RUNR_COMMAND");
            return direct::EXIT_CANNOT_EXEC;
        }
    };
    let upstream = Target::local(upstream_port);
    let (ready_tx, ready) = watch::channel(false);
    tokio::spawn(watch_upstream(
        upstream.clone(),
        config.observe.listen_wait,
        ready_tx,
    ));
    tracing::info!(
        addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        upstream = %upstream,
        command = ?config.command,
        tracing = config.observe.tracing,
        replay = config.observe.replay.is_some(),
        "observed proxy listening"
    );
    let ctx = Arc::new(Ctx {
        observer,
        upstream,
        ready,
        ready_deadline: Instant::now() + config.observe.listen_wait,
        timeout: config.timeout,
        rule,
    });
    tokio::select! {
        () = serve(listener, ctx, shutdown) => {
            let exit = direct::stop(&mut program).await;
            tracing::info!(status = exit.code(), "program stopped");
            0
        }
        exit = program.wait() => {
            tracing::error!(command = ?config.command, status = exit.code(), "the program exited: stopping");
            u8::try_from(exit.code()).ok().filter(|c| *c != 0).unwrap_or(1)
        }
    }
}

/// Flips `ready` once the program accepts connections; warns once if that takes longer than
/// `wait` and keeps waiting (requests answer 503 meanwhile).
async fn watch_upstream(upstream: Target, wait: Duration, ready: watch::Sender<bool>) {
    let mut warned = false;
    loop {
        match runr_tick::wait_for_listener(&upstream, wait).await {
            Ok(_probe) => {
                let _ = ready.send(true);
                return;
            }
            Err(e) if !warned => {
                warned = true;
                tracing::warn!("the program does not listen: {e}; answering 503 until it does");
            }
            Err(_) => {}
        }
    }
}

/// The shared accept loop and drain, with a service per client connection that owns that
/// connection's own upstream connection (see the module docs).
async fn serve(listener: TcpListener, ctx: Arc<Ctx>, shutdown: impl Future<Output = ()>) {
    serve_connections(listener, shutdown, |_peer| {
        let ctx = ctx.clone();
        let upstream: Arc<Mutex<Option<SendRequest<UpBody>>>> = Arc::default();
        service_fn(move |req| handle(ctx.clone(), upstream.clone(), req))
    })
    .await
}

async fn handle(
    ctx: Arc<Ctx>,
    upstream: Arc<Mutex<Option<SendRequest<UpBody>>>>,
    req: hyper::Request<Incoming>,
) -> Result<hyper::Response<DownBody>, Infallible> {
    let started = Instant::now();
    // A body the program (or the proxy's own answer) leaves unread is read and discarded after
    // the answer (lingering close), so the client gets the answer instead of a reset.
    let (parts, body) = req.into_parts();
    let body = Unread::new(body, &parts.headers, Linger::until(started + ctx.timeout));
    let req = hyper::Request::from_parts(parts, body);
    if is_probe(&req) {
        // Ready only once the program listens, so Knative does not route to a pod that would
        // make requests wait.
        let reply = if *ctx.ready.borrow() {
            Reply::with_type(StatusCode::OK, response::TEXT, Bytes::from_static(b"ok"))
        } else {
            Reply::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the function is not listening yet",
            )
        };
        return Ok(wrapper_response(reply));
    }
    if req.method() == Method::OPTIONS {
        return Ok(wrapper_response(preflight()));
    }
    Ok(proxy(&ctx, &upstream, req, started).await)
}

/// One request through to the program and its answer back, observed where it ends.
async fn proxy(
    ctx: &Arc<Ctx>,
    upstream: &Mutex<Option<SendRequest<UpBody>>>,
    req: hyper::Request<Unread>,
    started: Instant,
) -> hyper::Response<DownBody> {
    let (mut done, request) = observed(ctx, req, started);
    if !*ctx.ready.borrow() {
        let mut ready = ctx.ready.clone();
        let waited = tokio::time::timeout_at(ctx.ready_deadline, ready.wait_for(|r| *r)).await;
        if !matches!(waited, Ok(Ok(_))) {
            let reply = Reply::failure(
                ErrorClass::Unavailable,
                StatusCode::SERVICE_UNAVAILABLE,
                "the function is not listening yet",
            );
            return done.finish_now(reply, Some(Failure::Status));
        }
    }
    let mut sender = match take_sender(upstream).await {
        Some(s) => s,
        None => match connect(&ctx.upstream).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(upstream = %ctx.upstream, error = %e, "cannot connect to the program");
                let reply = Reply::failure(
                    ErrorClass::Crash,
                    StatusCode::BAD_GATEWAY,
                    "the function is not accepting connections",
                );
                return done.finish_now(reply, Some(Failure::Crash));
            }
        },
    };
    let sent = sender.send_request(request);
    // Back for the next request on this client connection; usable once this response is read.
    *upstream.lock().unwrap_or_else(|e| e.into_inner()) = Some(sender);
    match tokio::time::timeout(ctx.timeout, sent).await {
        Ok(Ok(res)) => {
            let (mut parts, body) = res.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            parts.headers.remove(ERROR_HEADER);
            if !parts.headers.contains_key(ACCESS_CONTROL_ALLOW_ORIGIN) {
                parts
                    .headers
                    .insert(ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
            }
            done.status = parts.status.as_u16();
            let body = ObservedBody {
                inner: body,
                done: Some(done),
            };
            hyper::Response::from_parts(parts, Either::Right(body))
        }
        Ok(Err(e)) => {
            let error = runr_base::fmt::error_chain(&e);
            tracing::warn!(upstream = %ctx.upstream, error = %error, "the program's connection failed");
            upstream.lock().unwrap_or_else(|e| e.into_inner()).take();
            let reply = Reply::failure(
                ErrorClass::Crash,
                StatusCode::BAD_GATEWAY,
                "the function's connection failed",
            );
            done.finish_now(reply, Some(Failure::Crash))
        }
        Err(_) => {
            // Dropping the in-flight exchange closes that upstream connection.
            upstream.lock().unwrap_or_else(|e| e.into_inner()).take();
            done.finish_now(Reply::timed_out(ctx.timeout), Some(Failure::Timeout))
        }
    }
}

/// What observes `req` (its span started, its headers and body kept as far as a span or a
/// capture needs them), and `req` as the program gets it: hop-by-hop headers stripped, the
/// span as its parent, the target in origin form.
fn observed(
    ctx: &Arc<Ctx>,
    req: hyper::Request<Unread>,
    started: Instant,
) -> (Done, hyper::Request<UpBody>) {
    let trigger = ctx.rule.of(req.headers());
    let cold_start = trace::take_cold_start();
    let span = ctx
        .observer
        .and_then(|o| o.start_span(req.headers(), SystemTime::now()));
    let (mut parts, body) = req.into_parts();
    let capture_limit = ctx.observer.and_then(Observer::replay_max_body);
    // A capture needs the client's headers after they went upstream; a span only the user
    // agent.
    let headers = match capture_limit {
        Some(_) => parts.headers.clone(),
        None => user_agent_only(&parts.headers),
    };
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let mut request = Request::head(trigger, parts.method.as_str(), target, headers);
    // The program gets the client's `X-Request-Id` as it was sent: no id of the proxy's own.
    request.replaced_id = None;
    let done = Done {
        ctx: ctx.clone(),
        span,
        request,
        kept: Arc::new(Mutex::new(Kept::default())),
        started,
        cold_start,
        status: 0,
        class: None,
        _in_flight: metrics::get().in_flight(),
    };
    strip_hop_by_hop(&mut parts.headers);
    // hyper answered the client's `Expect: 100-continue` when the body was first polled; the
    // program gets the body without having to ask for it.
    parts.headers.remove(http::header::EXPECT);
    if let Some(span) = &done.span {
        if let Ok(v) = HeaderValue::from_str(&span.traceparent()) {
            parts.headers.insert(trace::TRACEPARENT, v);
        }
    }
    if let Some(pq) = parts.uri.path_and_query().cloned() {
        // Origin form towards the program, whatever form the client used.
        parts.uri = pq.into();
    }
    let body = TeeBody {
        inner: body,
        kept: capture_limit.map(|limit| (done.kept.clone(), limit)),
    };
    (done, hyper::Request::from_parts(parts, body))
}

/// The stored upstream connection if it can take a request right now.
/// How long a kept upstream connection may take to become ready for the next request (its
/// connection task may not have seen the end of the previous response yet).
const REUSE_WAIT: Duration = Duration::from_secs(1);

/// The stored upstream connection once it can take a request; `None` when there is none or it
/// closed (by the program, or because the previous response was abandoned mid-body).
async fn take_sender(slot: &Mutex<Option<SendRequest<UpBody>>>) -> Option<SendRequest<UpBody>> {
    let mut sender = slot.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    if sender.is_ready() {
        return Some(sender);
    }
    if sender.is_closed() {
        return None;
    }
    match tokio::time::timeout(REUSE_WAIT, sender.ready()).await {
        Ok(Ok(())) => Some(sender),
        _ => None,
    }
}

async fn connect(upstream: &Target) -> Result<SendRequest<UpBody>, String> {
    let stream = TcpStream::connect((upstream.host.as_str(), upstream.port))
        .await
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream connection ended with an error");
        }
    });
    Ok(sender)
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers named in Connection are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(named.iter()) {
        headers.remove(name);
    }
}

fn user_agent_only(headers: &HeaderMap) -> HeaderMap {
    let mut kept = HeaderMap::new();
    if let Some(ua) = headers.get(http::header::USER_AGENT) {
        kept.insert(http::header::USER_AGENT, ua.clone());
    }
    kept
}

fn wrapper_response(reply: Reply) -> hyper::Response<DownBody> {
    into_response(reply).map(Either::Left)
}

// === request bookkeeping ===

/// The start of the request body, kept for a capture, and its total size.
#[derive(Debug, Default)]
struct Kept {
    data: Vec<u8>,
    size: u64,
}

/// Everything needed to observe a request once it ends.
struct Done {
    ctx: Arc<Ctx>,
    span: Option<Span>,
    /// The request's head, as the client sent it.
    request: Request,
    kept: Arc<Mutex<Kept>>,
    started: Instant,
    cold_start: bool,
    status: u16,
    /// The class of the proxy's own answer; a body the program broke off counts as a crash.
    class: Option<ErrorClass>,
    /// Counted in `runr_inflight_invocations` until observed.
    _in_flight: Held,
}

impl Done {
    /// Observes the request as ended now, `failure` overriding the status-based one.
    fn finish(self, failure: Option<Failure>) {
        let took = self.started.elapsed();
        let class = self
            .class
            .or((failure == Some(Failure::Crash)).then_some(ErrorClass::Crash));
        metrics::get().invocation(Invocation {
            trigger: self.request.trigger,
            status: self.status,
            took,
            error: class,
            cold_start: self.cold_start,
        });
        let Some(observer) = self.ctx.observer else {
            return;
        };
        let failure = failure.or((self.status >= 500).then_some(Failure::Status));
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let body = (&kept.data[..], kept.size);
        observer.finish(Finished {
            span: self.span.clone(),
            cold_start: self.cold_start,
            ..Finished::new(
                &self.request,
                &self.request.headers,
                body,
                self.status,
                took,
                failure,
            )
        });
    }

    /// A wrapper-made answer: observed at once.
    fn finish_now(mut self, reply: Reply, failure: Option<Failure>) -> hyper::Response<DownBody> {
        self.status = reply.status.as_u16();
        self.class = reply.error_class();
        self.finish(failure);
        wrapper_response(reply)
    }
}

/// The client's request body on its way to the program, copying its first bytes aside when a
/// capture may need them.
pub struct TeeBody {
    inner: Unread,
    kept: Option<(Arc<Mutex<Kept>>, usize)>,
}

impl Body for TeeBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some((kept, limit))) = (&polled, &this.kept) {
            if let Some(data) = frame.data_ref() {
                let mut k = kept.lock().unwrap_or_else(|e| e.into_inner());
                k.size += data.len() as u64;
                let room = limit.saturating_sub(k.data.len());
                k.data.extend_from_slice(&data[..room.min(data.len())]);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The program's response body on its way to the client; the request is observed when it ends,
/// fails, or is abandoned by the client.
pub struct ObservedBody {
    inner: Incoming,
    done: Option<Done>,
}

impl Body for ObservedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let mut polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &mut polled {
            if let Some(trailers) = frame.trailers_mut() {
                trailers.remove(ERROR_HEADER);
            }
        }
        match &polled {
            Poll::Ready(None) => {
                if let Some(done) = this.done.take() {
                    done.finish(None);
                }
            }
            Poll::Ready(Some(Err(_))) => {
                // The program broke off its answer: a crash, whatever status it had sent.
                if let Some(done) = this.done.take() {
                    done.finish(Some(Failure::Crash));
                }
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for ObservedBody {
    fn drop(&mut self) {
        // The client went away (or hyper never polled an empty body to its end).
        if let Some(done) = self.done.take() {
            done.finish(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_named_in_connection_are_dropped() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, X-Session"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("te", "trailers"),
            ("x-session", "1"),
            ("content-length", "5"),
            ("traceparent", "00-x"),
            ("host", "fn"),
        ] {
            h.insert(http::HeaderName::from_static(k), v.parse().unwrap());
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-length", "host", "traceparent"]);
    }
}
