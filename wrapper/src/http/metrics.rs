//! The Prometheus endpoint on `RUNR_METRICS_PORT`: `GET /metrics` in the text exposition format.
//! Its own listener and task, apart from the invocations: it answers while every worker is down
//! or busy, and during the SIGTERM drain.

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use http::{Method, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;

use super::serve_connections;
use crate::observe::metrics;
use crate::response::Reply;

/// The content type of the Prometheus text format.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Binds `port` on every interface and serves the endpoint in a task of its own until the
/// process ends; logs `serving metrics metrics_addr=<addr>`.
pub async fn start(port: u16) -> std::io::Result<()> {
    let listener = super::bind(port).await?;
    tracing::info!(
        metrics_addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        "serving metrics on /metrics"
    );
    tokio::spawn(serve_connections(
        listener,
        // The endpoint stays up through the drain; it ends with the runtime.
        std::future::pending(),
        |_peer| service_fn(handle),
    ));
    Ok(())
}

async fn handle(req: hyper::Request<Incoming>) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let reply = match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            let mut res = hyper::Response::new(Full::new(Bytes::from(metrics::get().render())));
            res.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_TEXT));
            return Ok(res);
        }
        (_, "/metrics") => {
            let mut r = Reply::error(StatusCode::METHOD_NOT_ALLOWED, "only GET /metrics");
            r.headers
                .push((ALLOW, HeaderValue::from_static("GET, HEAD")));
            r
        }
        _ => Reply::error(StatusCode::NOT_FOUND, "only GET /metrics"),
    };
    let mut res = hyper::Response::new(Full::new(reply.body));
    *res.status_mut() = reply.status;
    for (name, value) in reply.headers {
        res.headers_mut().append(name, value);
    }
    Ok(res)
}
