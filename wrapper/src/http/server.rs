//! The HTTP side of exec, persistent and lambda mode: the accept loop, probes (ready once the
//! invoker is: persistent mode once every worker has started and while one is alive), CORS,
//! the request limits, admission control, one [`Invoker::invoke`] per request (lambda mode: its
//! own answer, which may stream), the metrics endpoint, and the SIGTERM drain.
//!
//! A request goes through, in this order, each step answering by itself when it refuses
//! ([`Refusal`]): probes and preflights (no invocation); what its head alone decides (a declared
//! body over [`MAX_BODY`]: 413; exec-mode headers the kernel would not pass: 431); a slot
//! and the bytes it will hold ([`Admission`]: 413 when they are more than the whole
//! `RUNR_MAX_INFLIGHT_BYTES`, 503 when the line is full, 504 when `RUNR_TIMEOUT` passes in
//! line); only then its body (413, 400, 408 at the deadline); then the invocation, with what is
//! left of the same deadline. Whatever answers, a body not read to its end is read and thrown
//! away after the answer ([`super::linger`]), and the answer's bytes stay counted until it has
//! been written.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{Method, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::{Body as _, Incoming};
use hyper::service::service_fn;
use tokio::time::Instant;

use super::admission::{Admission, Held};
use super::linger::{Linger, Unread};
use super::{into_response, is_probe, preflight, serve_connections, Refusal};
use crate::config::memory::BudgetSource;
use crate::config::{Config, Mode, Trigger};
use crate::envelope::{BODY_PIECE, WRITE_CHUNK};
use crate::invoke::lambda::{self, StreamedBody};
use crate::invoke::{self, Invoker, Outcome};
use crate::observe;
use crate::observe::metrics::{self, Invocation};
use crate::request::body::{BodyError, BodyReader, MAX_BODY};
use crate::request::trigger::TriggerRule;
use crate::request::Request;
use crate::response::{self, Reply};

/// An answer's body: whole, or streamed by a Lambda runtime.
type ResBody = Either<Holding, StreamedBody>;

/// What every connection's requests share.
struct Ctx {
    invoker: Arc<Invoker>,
    admission: Admission,
    rule: TriggerRule,
    timeout: Duration,
}

/// Runs exec or persistent mode until `shutdown`: starts the invoker (persistent workers start
/// right away), binds `PORT`, serves until `shutdown` completes, drains for up to
/// [`DRAIN_LIMIT`](super::DRAIN_LIMIT), then stops the workers. Returns the exit status. The
/// observer, the reaper and the signal handlers are the caller's ([`crate::commands`]).
pub async fn run(config: &Config, shutdown: impl Future<Output = ()>) -> u8 {
    let rule = TriggerRule::of_config(config);
    metrics::get().configure(rule.usual(), config.mode == Mode::Persistent);
    if let Some(port) = config.telemetry.metrics_port {
        if let Err(e) = super::metrics::start(port).await {
            tracing::error!(port, error = %e, "cannot listen on RUNR_METRICS_PORT");
            return 1;
        }
    }
    if matches!(config.mode, Mode::Exec | Mode::Persistent) {
        invoke::check_program(&config.command[0]);
    }
    let Some(invoker) = Invoker::new(config) else {
        tracing::error!(mode = %config.mode.as_str(), "this mode has no invoker");
        return 1;
    };
    let listener = match super::bind(config.port).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("serve failed: cannot listen on port {}: {e}", config.port);
            return 1;
        }
    };
    let slots = invoker.slots();
    tracing::info!(
        addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        mode = %config.mode.as_str(),
        command = ?config.command,
        trigger = %rule.as_str(),
        workers = config.workers,
        slots,
        max_queue = config.max_queue,
        timeout = %invoke::display_timeout(config.timeout),
        "listening"
    );
    let memory = &config.memory;
    metrics::get().memory(memory.limit, memory.budget);
    tracing::info!(
        cgroup_limit = %memory.limit.map_or("none".to_string(), display_bytes),
        max_inflight_bytes = %memory.budget.map_or("unlimited".to_string(), display_bytes),
        from = match memory.source {
            BudgetSource::Variable => "RUNR_MAX_INFLIGHT_BYTES",
            BudgetSource::Limit if memory.limit.is_some() => "half the cgroup limit",
            BudgetSource::Limit => "no cgroup limit",
        },
        "memory budget"
    );
    let ctx = Arc::new(Ctx {
        invoker: Arc::new(invoker),
        admission: Admission::new(slots, config.memory.budget, config.max_queue),
        rule,
        timeout: config.timeout,
    });
    serve_connections(listener, shutdown, |peer| {
        let ctx = ctx.clone();
        service_fn(move |req| handle(ctx.clone(), peer, req))
    })
    .await;
    ctx.invoker.shutdown().await;
    tracing::info!("stopped");
    0
}

async fn handle(
    ctx: Arc<Ctx>,
    peer: SocketAddr,
    req: hyper::Request<Incoming>,
) -> Result<hyper::Response<ResBody>, Infallible> {
    let arrived = Instant::now();
    // Whatever answers, a body left unread is read and discarded after the answer (lingering
    // close), so the client gets the answer instead of a reset.
    let (parts, body) = req.into_parts();
    let body = Unread::new(body, &parts.headers, Linger::until(arrived + ctx.timeout));
    let req = hyper::Request::from_parts(parts, body);
    let reply = if is_probe(&req) {
        // Knative's probes must not cost an invocation. Not ready (persistent mode: until
        // every worker has started, and while none is alive; lambda mode: until a runtime has
        // initialised), no traffic is routed to a pod that could not serve it.
        if ctx.invoker.ready() {
            Reply::with_type(StatusCode::OK, response::TEXT, Bytes::from_static(b"ok"))
        } else {
            let message = match &*ctx.invoker {
                Invoker::Pool(_) => "no worker is ready",
                _ => "the function is not ready",
            };
            Reply::error(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    } else if req.method() == Method::OPTIONS {
        preflight()
    } else {
        let trigger = ctx.rule.of(req.headers());
        match invocation(&ctx, peer, req, trigger, arrived).await {
            Ok(res) => return Ok(res),
            Err(refusal) => {
                // A client's request or the load, not a fault of ours: debug only.
                tracing::debug!(refusal = refusal.as_str(), "request refused");
                count_refusal(refusal, trigger, arrived);
                refusal.reply(ctx.timeout)
            }
        }
    };
    Ok(answer(reply, Held::unlimited()))
}

/// One request that may invoke the handler, from its head to its answer (see the module docs
/// for the order of the checks).
async fn invocation(
    ctx: &Ctx,
    peer: SocketAddr,
    req: hyper::Request<Unread>,
    trigger: Trigger,
    arrived: Instant,
) -> Result<hyper::Response<ResBody>, Refusal> {
    let version = req.version();
    // Waiting for a slot and reading the body count against the invocation's time.
    let deadline = arrived + ctx.timeout;
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // Refuse a declared oversize body before reading a byte of it.
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(BodyError::TooLarge.into());
    }
    let (parts, body) = req.into_parts();
    let target = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    let mut request = Request::head(trigger, parts.method.as_str(), target, parts.headers);
    // When it times out, for the handler (`RUNR_DEADLINE_MS`, `deadlineMs`): before the check,
    // as the variable is part of what must fit.
    request.deadline_ms = Some(invoke::deadline_ms(deadline));
    // With tracing on, the handler sees the wrapper's span as its parent (before the check:
    // the traceparent it gets is part of what must fit).
    let mut span = invoke::start(&mut request);
    if ctx.invoker.check(&request).is_err() {
        return Err(Refusal::HeadersTooLarge);
    }
    let keep = observe::global()
        .and_then(|o| o.replay_max_body())
        .unwrap_or(0);
    // Raw exec input goes from the socket into the handler as it arrives; everything else
    // needs the whole body first.
    let streamed = ctx.invoker.streams_body();
    let body_size = match body.is_end_stream() {
        true => 0,
        // Chunked: as much as it may be.
        false => declared.unwrap_or(MAX_BODY as u64),
    };
    let mut slot = ctx
        .admission
        .admit(deadline, holds(&ctx.invoker, body_size, keep))
        .await?;
    let mut body = BodyReader::new(body, keep);
    if !streamed {
        match tokio::time::timeout_at(deadline, body.read_whole(declared)).await {
            Ok(whole) => request.set_body(whole?),
            Err(_elapsed) => return Err(BodyError::TimedOut.into()),
        }
        // A chunked body was reserved at the limit: the rest goes back.
        let surplus = body_size.saturating_sub(request.body.len() as u64);
        slot.held().release(surplus * body_factor(&ctx.invoker));
    }
    span.begin();
    let tag = span.tag(&request);
    let request = Arc::new(request);
    if let Invoker::Lambda(lambda) = &*ctx.invoker {
        // Its own answer, which may stream: observed where it ends, the slot held until then.
        let (slot, mut held) = slot.split();
        let client = lambda::Client { peer, version };
        return Ok(
            match lambda
                .respond(request, client, arrived, deadline, span, slot)
                .await
            {
                lambda::Answer::Whole(reply) => {
                    held.charge(reply.body.len() as u64);
                    answer(reply, held)
                }
                lambda::Answer::Streamed { head, body } => {
                    into_response(head).map(|_| Either::Right(body))
                }
            },
        );
    }
    let outcome = ctx
        .invoker
        .invoke(
            &request,
            streamed.then_some(&mut body),
            deadline,
            tag,
            slot.held(),
        )
        .await;
    // The answer is held until it is written to the client: counted until then.
    slot.held().charge(outcome.reply.body.len() as u64);
    let held = slot.into_held();
    let seen = match streamed {
        true => (body.kept(), body.seen()),
        false => (&request.body[..], request.body.len() as u64),
    };
    observe(&request, seen, &outcome, arrived.elapsed(), span);
    Ok(answer(outcome.reply, held))
}

/// What one envelope encoding holds besides the body: one piece being encoded (a piece at
/// most 6 times as long once JSON-escaped) and one write to the pipe.
const ENVELOPE_PIECE: u64 = (6 * BODY_PIECE + WRITE_CHUNK) as u64;

/// Bytes held per body byte: lambda mode builds its event whole (the body as base64 or
/// JSON-escaped text beside it), the other modes hold the body once.
fn body_factor(invoker: &Invoker) -> u64 {
    match invoker {
        Invoker::Lambda(_) => 3,
        _ => 1,
    }
}

/// The bytes a request with a body of `body` bytes will hold while it runs, reserved before a
/// byte of the body is read: the body (unless raw input streams it), the envelope being
/// encoded, the start of the body a replay capture keeps (`keep`). Its answer is charged once
/// it is known.
fn holds(invoker: &Invoker, body: u64, keep: usize) -> u64 {
    let capture = body.min(keep as u64);
    if invoker.streams_body() {
        return capture;
    }
    let envelope = match invoker {
        Invoker::Exec(_) | Invoker::Pool(_) if body > 0 => ENVELOPE_PIECE,
        _ => 0,
    };
    body * body_factor(invoker) + envelope + capture
}

/// The response of a whole answer, holding `held` until it has been written.
fn answer(reply: Reply, held: Held) -> hyper::Response<ResBody> {
    into_response(reply).map(|body| Either::Left(Holding { body, _held: held }))
}

/// An answer's body with the budget bytes it holds, given back once hyper has written it (or
/// the client went away).
pub struct Holding {
    body: Full<Bytes>,
    _held: Held,
}

impl hyper::body::Body for Holding {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// `268435456` as `256MiB`, `1536` as `1.5KiB`: what the start line says.
fn display_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut scaled = n as f64;
    while scaled >= 1024.0 && unit < UNITS.len() - 1 {
        scaled /= 1024.0;
        unit += 1;
    }
    if scaled.fract() == 0.0 {
        format!("{scaled}{}", UNITS[unit])
    } else {
        format!("{scaled:.1}{}", UNITS[unit])
    }
}

/// THE point where an invocation has completed: the parsed request (method, path, headers,
/// body), the outcome (status, answer, what the handler did) and the time it took. Metrics,
/// the invocation line, access lines, server spans and replay capture hook in here
/// ([`invoke::finish`]); `span` is the server span started before the handler ran.
fn observe(
    req: &Request,
    body: (&[u8], u64),
    outcome: &Outcome,
    elapsed: Duration,
    span: invoke::Started,
) {
    invoke::finish(req, body, outcome, elapsed, span);
}

/// The metrics of a request answered before any handler ran: refusals (413, 431, 503) count in
/// `runr_rejected_total` only; a request whose time ran out while it waited for a slot is an
/// invocation that timed out.
fn count_refusal(refusal: Refusal, trigger: Trigger, arrived: Instant) {
    match refusal.rejected() {
        Some(why) => metrics::get().rejected(why),
        None if refusal == Refusal::QueueTimedOut => metrics::get().invocation(Invocation {
            trigger,
            status: StatusCode::GATEWAY_TIMEOUT.as_u16(),
            took: arrived.elapsed(),
            error: refusal.class(),
            cold_start: false,
        }),
        // A body that could not be read or came too late: the client's, not counted.
        None => {}
    }
}
