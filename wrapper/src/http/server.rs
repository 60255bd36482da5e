//! The HTTP side of exec and persistent mode: the accept loop, probes, CORS, the request-size
//! limit, one [`Invoker::invoke`] per request, and the SIGTERM drain.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use tokio::time::Instant;

use super::{into_response, is_probe, preflight, serve_connections};
use crate::config::{Config, Trigger};
use crate::envelope::Request;
use crate::invoke::{self, Invoker, Outcome};
use crate::response::{self, Reply};

/// Largest request body; larger ones answer 413 before being read.
pub const MAX_BODY: usize = 10 * 1024 * 1024;

/// What every connection's requests share.
struct Ctx {
    invoker: Arc<Invoker>,
    trigger: Trigger,
}

/// Runs exec or persistent mode until `shutdown`: starts the invoker (persistent workers start
/// right away), binds `PORT`, serves until `shutdown` completes, drains for up to
/// [`DRAIN_LIMIT`](super::DRAIN_LIMIT), then stops the workers. Returns the exit status. The
/// observer, the reaper and the signal handlers are the caller's ([`crate::commands`]).
pub async fn run(config: &Config, shutdown: impl Future<Output = ()>) -> u8 {
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
    tracing::info!(
        addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        mode = %config.mode.as_str(),
        command = ?config.command,
        trigger = %config.trigger.as_str(),
        workers = config.workers,
        timeout = %invoke::display_timeout(config.timeout),
        "listening"
    );
    let ctx = Arc::new(Ctx {
        invoker: Arc::new(invoker),
        trigger: config.trigger,
    });
    serve_connections(listener, shutdown, || {
        let ctx = ctx.clone();
        service_fn(move |req| handle(ctx.clone(), req))
    })
    .await;
    ctx.invoker.shutdown().await;
    tracing::info!("stopped");
    0
}

async fn handle(
    ctx: Arc<Ctx>,
    req: hyper::Request<Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let started = Instant::now();
    let reply = if is_probe(&req) {
        // Knative's probes check the wrapper is up; they must not cost an invocation.
        Reply::with_type(StatusCode::OK, response::TEXT, Bytes::from_static(b"ok"))
    } else if req.method() == Method::OPTIONS {
        preflight()
    } else {
        match read_request(ctx.trigger, req).await {
            Err(reply) => reply,
            Ok(mut request) => {
                // With tracing on, the handler sees the wrapper's span as its parent.
                let span = invoke::start(&mut request);
                let outcome = ctx.invoker.invoke(&request).await;
                observe(&request, &outcome, started.elapsed(), span);
                outcome.reply
            }
        }
    };
    Ok(into_response(reply))
}

/// THE point where an invocation has completed: the parsed request (method, path, headers,
/// body), the outcome (status, answer, what the handler did) and the time it took. Access
/// lines, server spans and replay capture hook in here ([`invoke::finish`]); `span` is the
/// server span started before the handler ran.
fn observe(req: &Request, outcome: &Outcome, elapsed: Duration, span: invoke::Started) {
    tracing::debug!(
        id = %req.id,
        method = %req.method,
        path = %req.path,
        status = outcome.reply.status.as_u16(),
        ended = ?outcome.ended,
        ms = elapsed.as_secs_f64() * 1000.0,
        "invocation"
    );
    invoke::finish(req, outcome, elapsed, span);
}

/// Reads the body (up to [`MAX_BODY`]) and parses the request once.
async fn read_request(trigger: Trigger, req: hyper::Request<Incoming>) -> Result<Request, Reply> {
    let too_large = || Reply::error(StatusCode::PAYLOAD_TOO_LARGE, "request body exceeds 10 MiB");
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // Refuse a declared oversize body before reading a byte of it.
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Err(_) => {
            return Err(Reply::error(
                StatusCode::BAD_REQUEST,
                "could not read the request body",
            ))
        }
    };
    let target = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    Ok(Request::new(
        trigger,
        parts.method.as_str(),
        target,
        parts.headers,
        body,
    ))
}
