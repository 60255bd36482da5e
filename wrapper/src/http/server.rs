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

use super::admission::Admission;
use super::linger::{Linger, Unread};
use super::{into_response, is_probe, preflight, serve_connections, Refusal};
use crate::config::memory::BudgetSource;
use crate::config::{Config, Mode, Trigger};
use crate::invoke::budget::Held;
use crate::invoke::lambda::StreamedBody;
use crate::invoke::{self, Client, Invocation, Invoker, Outcome};
use crate::observe::metrics;
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
        timeout = %response::display_timeout(config.timeout),
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
            Reply::error(StatusCode::SERVICE_UNAVAILABLE, ctx.invoker.not_ready())
        }
    } else if req.method() == Method::OPTIONS {
        preflight()
    } else {
        let trigger = ctx.rule.of(req.headers());
        let client = Client {
            peer,
            version: req.version(),
        };
        match invocation(&ctx, client, req, trigger, arrived).await {
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
    client: Client,
    req: hyper::Request<Unread>,
    trigger: Trigger,
    arrived: Instant,
) -> Result<hyper::Response<ResBody>, Refusal> {
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
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let request = Request::head(trigger, parts.method.as_str(), target, parts.headers);
    let mut inv = Invocation::new(request, arrived, ctx.timeout, Some(client));
    if ctx.invoker.check(inv.request()).is_err() {
        return Err(Refusal::HeadersTooLarge);
    }
    // Chunked: as much as it may be.
    let reserved = match body.is_end_stream() {
        true => 0,
        false => declared.unwrap_or(MAX_BODY as u64),
    };
    let wants = ctx.invoker.holds(reserved, inv.keep());
    let (slot, held) = ctx.admission.admit(inv.deadline(), wants).await?.split();
    inv.admitted(slot, held);
    let body = BodyReader::new(body, inv.keep());
    ctx.invoker
        .take_body(&mut inv, body, declared, reserved)
        .await?;
    Ok(respond(ctx.invoker.invoke(inv).await))
}

/// The response of an outcome: its whole answer, holding its bytes until written, or its head
/// and the body as it streams.
fn respond(outcome: Outcome) -> hyper::Response<ResBody> {
    match outcome.stream {
        Some(stream) => into_response(outcome.reply).map(|_| Either::Right(stream)),
        None => answer(outcome.reply, outcome.held),
    }
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

/// The metrics of a request answered before any handler ran: refusals (413, 431, 503) count in
/// `runr_rejected_total` only; a request whose time ran out while it waited for a slot is an
/// invocation that timed out.
fn count_refusal(refusal: Refusal, trigger: Trigger, arrived: Instant) {
    match refusal.rejected() {
        Some(why) => metrics::get().rejected(why),
        None if refusal == Refusal::QueueTimedOut => {
            metrics::get().invocation(metrics::Invocation {
                trigger,
                status: StatusCode::GATEWAY_TIMEOUT.as_u16(),
                took: arrived.elapsed(),
                error: refusal.class(),
                cold_start: false,
            })
        }
        // A body that could not be read or came too late: the client's, not counted.
        None => {}
    }
}
