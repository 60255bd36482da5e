//! The wrapper's HTTP faces: the server of exec and persistent mode ([`server`]), the observed
//! proxy of http mode ([`proxy`]), and http mode's direct run of the program ([`direct`]). What
//! the two servers share lives here: the accept loop with its drain, probes, CORS and the
//! conversion of a [`Reply`] into a response.

pub(crate) mod direct;
pub(crate) mod proxy;
pub(crate) mod server;

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    HeaderValue, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_MAX_AGE,
};
use http::StatusCode;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use tokio::net::TcpListener;

use crate::response::Reply;

/// How long in-flight requests get to finish after SIGTERM.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(25);

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
