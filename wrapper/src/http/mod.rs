//! The wrapper's HTTP faces: the server of exec, persistent and lambda mode ([`server`]), the
//! observed proxy of http mode ([`proxy`]), http mode's direct run of the program ([`direct`]),
//! and the Prometheus endpoint ([`metrics`]). What the two servers share lives here: the accept
//! loop with its drain, probes, CORS, the refusals and the conversion of a [`Reply`] into a
//! response.

pub(crate) mod admission;
pub(crate) mod direct;
pub(crate) mod linger;
pub(crate) mod metrics;
pub(crate) mod proxy;
pub(crate) mod server;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    HeaderValue, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_MAX_AGE, RETRY_AFTER,
};
use http::StatusCode;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use tokio::net::TcpListener;

use crate::observe::metrics::Rejected;
use crate::request::body::BodyError;
use crate::response::{ErrorClass, Reply};

/// How long in-flight requests get to finish after SIGTERM.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(25);

/// The accept loop every HTTP face of the wrapper shares (exec/persistent/lambda server,
/// observed proxy): [`runr_base::serve::serve_connections`] with hyper's default header-read
/// timeout (slow clients cannot pin a task) and [`DRAIN_LIMIT`]; `make_service` gets each
/// connection's peer address.
pub async fn serve_connections<S, B>(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    mut make_service: impl FnMut(SocketAddr) -> S,
) where
    S: hyper::service::HttpService<Incoming, ResBody = B> + Send + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new());
    runr_base::serve::serve_connections(listener, http, shutdown, DRAIN_LIMIT, |_, peer| {
        make_service(peer)
    })
    .await;
}

/// Why a request was answered without invoking the handler. Each has one answer, made in
/// [`Refusal::reply`]; none of them is an invocation (no access line, span or capture).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 413, 400 or 408: the body is larger than the server takes (declared, or counted while
    /// reading), could not be read, or had not arrived by the invocation's deadline.
    Body(BodyError),
    /// 431: exec mode: the headers cannot be passed to the handler as environment variables
    /// (one longer than the kernel takes, or all of them together).
    HeadersTooLarge,
    /// 503 with `Retry-After: 1`: every slot (or the byte budget) taken and `RUNR_MAX_QUEUE`
    /// requests waiting.
    Overloaded,
    /// 504: `RUNR_TIMEOUT` passed while the request waited for a slot.
    QueueTimedOut,
    /// 413: the request would hold more bytes than the whole `RUNR_MAX_INFLIGHT_BYTES`.
    OverBudget,
}

impl Refusal {
    /// A stable name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Body(e) => e.as_str(),
            Refusal::HeadersTooLarge => "headers_too_large",
            Refusal::Overloaded => "overloaded",
            Refusal::QueueTimedOut => "queue_timed_out",
            Refusal::OverBudget => "over_budget",
        }
    }

    /// The `X-RunR-Error` class of the answer: `limit` (413, 431), `overload` (503),
    /// `timeout` (504 in line), `request` for a body the client could not send (400, 408).
    pub fn class(self) -> Option<ErrorClass> {
        match self {
            Refusal::Body(BodyError::TooLarge) | Refusal::HeadersTooLarge | Refusal::OverBudget => {
                Some(ErrorClass::Limit)
            }
            Refusal::Body(BodyError::Unreadable | BodyError::TimedOut) => Some(ErrorClass::Request),
            Refusal::Overloaded => Some(ErrorClass::Overload),
            Refusal::QueueTimedOut => Some(ErrorClass::Timeout),
        }
    }

    /// The `runr_rejected_total` reason, for the refusals that count there.
    pub fn rejected(self) -> Option<Rejected> {
        match self {
            Refusal::Body(BodyError::TooLarge) => Some(Rejected::BodyTooLarge),
            Refusal::HeadersTooLarge => Some(Rejected::HeadersTooLarge),
            Refusal::Overloaded => Some(Rejected::Overload),
            Refusal::OverBudget => Some(Rejected::OverBudget),
            Refusal::Body(_) | Refusal::QueueTimedOut => None,
        }
    }

    /// The answer; `timeout` is `RUNR_TIMEOUT`, named in the 504.
    pub fn reply(self, timeout: Duration) -> Reply {
        let (status, message) = match self {
            Refusal::Body(e) => return e.reply(),
            Refusal::HeadersTooLarge => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "request headers too large".to_string(),
            ),
            Refusal::Overloaded => (StatusCode::SERVICE_UNAVAILABLE, "overloaded".to_string()),
            Refusal::OverBudget => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "request needs more memory than RUNR_MAX_INFLIGHT_BYTES".to_string(),
            ),
            Refusal::QueueTimedOut => return Reply::timed_out(timeout),
        };
        let mut reply = match self.class() {
            Some(class) => Reply::failure(class, status, &message),
            None => Reply::error(status, &message),
        };
        if self == Refusal::Overloaded {
            reply
                .headers
                .push((RETRY_AFTER, HeaderValue::from_static("1")));
        }
        reply
    }
}

impl From<BodyError> for Refusal {
    fn from(e: BodyError) -> Refusal {
        Refusal::Body(e)
    }
}

/// Binds the wrapper's port on every interface (`0`: the kernel picks one; the `listening`
/// line says which).
pub async fn bind(port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind(("0.0.0.0", port)).await
}

/// True for Knative's probes (`K-Network-Probe` from the activator and queue-proxy,
/// `K-Kubelet-Probe` from the kubelet): they check the wrapper, never the function.
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
