//! The HTTP side of exec and persistent mode: accept loop on a bound listener, probes, CORS,
//! the request-size limit, one [`Invoker::invoke`] per request, and the SIGTERM drain.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    HeaderValue, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_MAX_AGE, CONTENT_LENGTH,
};
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioTimer;
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::config::Trigger;
use crate::envelope::Request;
use crate::invoke::{Invoker, Outcome};
use crate::response::{self, Reply};

/// Largest request body; larger ones answer 413 before being read.
pub const MAX_BODY: usize = 10 * 1024 * 1024;

/// How long in-flight requests get to finish after SIGTERM.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(25);

/// What every connection's requests share.
struct Ctx {
    invoker: Arc<Invoker>,
    trigger: Trigger,
}

/// Serves `listener` until `shutdown` completes, then stops accepting and waits up to
/// [`DRAIN_LIMIT`] for in-flight requests. Workers are the caller's to stop afterwards.
pub async fn run(
    listener: TcpListener,
    invoker: Arc<Invoker>,
    trigger: Trigger,
    shutdown: impl Future<Output = ()>,
) {
    let ctx = Arc::new(Ctx { invoker, trigger });
    serve_connections(listener, shutdown, || {
        let ctx = ctx.clone();
        service_fn(move |req| handle(ctx.clone(), req))
    })
    .await
}

/// The accept loop every HTTP face of the wrapper shares (exec/persistent server, observed
/// proxy): [`runr_base::serve::serve_connections`] with hyper's default header-read timeout
/// (slow clients cannot pin a task) and [`DRAIN_LIMIT`].
pub async fn serve_connections<S, B>(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    mut make_service: impl FnMut() -> S,
) where
    S: hyper::service::HttpService<Incoming, ResBody = B> + Send + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new());
    runr_base::serve::serve_connections(listener, http, shutdown, DRAIN_LIMIT, |_, _| {
        make_service()
    })
    .await;
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
                let span = crate::observe::start(&mut request);
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
/// lines, server spans and replay capture hook in here ([`crate::observe`]); `span` is the
/// server span started before the handler ran.
fn observe(req: &Request, outcome: &Outcome, elapsed: Duration, span: crate::observe::Started) {
    tracing::debug!(
        id = %req.id,
        method = %req.method,
        path = %req.path,
        status = outcome.reply.status.as_u16(),
        ended = ?outcome.ended,
        ms = elapsed.as_secs_f64() * 1000.0,
        "invocation"
    );
    crate::observe::invocation(req, outcome, elapsed, span);
}

pub(crate) fn is_probe<B>(req: &hyper::Request<B>) -> bool {
    let h = req.headers();
    h.contains_key("k-network-probe") || h.contains_key("k-kubelet-probe")
}

/// 204 with the CORS headers the built-in runtimes send.
pub(crate) fn preflight() -> Reply {
    Reply {
        status: StatusCode::NO_CONTENT,
        headers: vec![
            (
                ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, PUT, DELETE, PATCH, OPTIONS"),
            ),
            (
                ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static("Content-Type, Authorization"),
            ),
            (ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("86400")),
        ],
        body: Bytes::new(),
    }
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

/// Reply → hyper response, adding `Access-Control-Allow-Origin: *` unless the handler set it.
pub(crate) fn into_response(reply: Reply) -> hyper::Response<Full<Bytes>> {
    let mut res = hyper::Response::new(Full::new(reply.body));
    *res.status_mut() = reply.status;
    let headers = res.headers_mut();
    for (name, value) in reply.headers {
        headers.append(name, value);
    }
    if !headers.contains_key(ACCESS_CONTROL_ALLOW_ORIGIN) {
        headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    }
    res
}
