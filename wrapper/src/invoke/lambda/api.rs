//! The Lambda Runtime API (`2018-06-01`) one slot's runtime talks to, on that slot's own
//! loopback port:
//!
//! - `GET /2018-06-01/runtime/invocation/next` → 200, the event (`Content-Type:
//!   application/json`) with `Lambda-Runtime-Aws-Request-Id`, `-Deadline-Ms`,
//!   `-Invoked-Function-Arn` and (tracing on) `-Trace-Id`; a long poll;
//! - `POST …/invocation/{id}/response` → 202; above 6 MiB 413 `RequestEntityTooLarge`;
//!   with `Lambda-Runtime-Function-Response-Mode: streaming` the body goes to the client as it
//!   comes, and error trailers end it early;
//! - `POST …/invocation/{id}/error` → 202 (a document up to 6 MiB, read whole; above, 413);
//! - `POST /2018-06-01/runtime/init/error` → 202, the runtime is restarted;
//! - an id that is not the runtime's → 400 `InvalidRequestID`; a second answer, or a request
//!   out of order → 403 `InvalidStateTransition`; a body cut off → 400
//!   `TruncatedHTTPRequest`; an unknown response mode → 400 `InvalidFunctionResponseMode`;
//! - the Extensions, Telemetry and Logs APIs → 404 naming them as not supported.
//!
//! Every error is `{"errorMessage", "errorType"}` and leaves the runtime running.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::sync::mpsc;

use super::result;
use super::slot::{ApiError, Chunk, Delivery, Failure, NextEvent, Slot, Streamed};
use super::{Shared, MAX_PAYLOAD};

/// The header that asks for a streamed response.
pub const RESPONSE_MODE: &str = "lambda-runtime-function-response-mode";
/// The header naming an error's type.
pub const ERROR_TYPE: &str = "lambda-runtime-function-error-type";
/// Pieces of a streamed response in flight between runtime and client at most: a client that
/// reads slowly slows the runtime's upload down rather than filling memory.
const STREAM_BUFFER: usize = 16;
/// Largest init error body read (`/init/error`); what is beyond is dropped. An invocation's
/// error document (`/error`) may be as large as a response: [`MAX_PAYLOAD`].
const MAX_ERROR_BODY: usize = MAX_PAYLOAD;
/// How much of an oversized response is read (and dropped) before it is refused, so that a
/// runtime that sends it without waiting still reads the 413 instead of a reset.
const MAX_DRAIN: usize = 64 * 1024 * 1024;

/// What a Runtime API handler needs besides its slot.
pub struct Api {
    /// The slot this port belongs to.
    pub slot: Arc<Slot>,
    /// `Lambda-Runtime-Invoked-Function-Arn`.
    pub function_arn: HeaderValue,
    /// What the slots share (an init error fails the queue when no runtime is ready).
    pub shared: Arc<Shared>,
}

/// A Runtime API response.
pub type ApiResponse = hyper::Response<Full<Bytes>>;

/// One request to the Runtime API.
pub async fn handle(
    api: Arc<Api>,
    req: hyper::Request<Incoming>,
) -> Result<ApiResponse, Infallible> {
    let path = req.uri().path().to_string();
    let route = route(&path);
    tracing::debug!(slot = api.slot.index, method = %req.method(), path = %path, "runtime api");
    let res = match (route, req.method()) {
        (Route::Next, &Method::GET) => next(&api).await,
        (Route::Response(id), &Method::POST) => response(&api, id, req).await,
        (Route::Error(id), &Method::POST) => error(&api, id, req).await,
        (Route::InitError, &Method::POST) => init_error(&api, req).await,
        (Route::Unsupported(what), _) => reject(&ApiError {
            status: StatusCode::NOT_FOUND,
            error_type: "NotSupported",
            message: format!("the {what} is not supported by runr-wrapper's lambda mode"),
        }),
        (Route::Unknown, _) => reject(&ApiError {
            status: StatusCode::NOT_FOUND,
            error_type: "NotFound",
            message: format!("no Runtime API resource at {path}"),
        }),
        (_, method) => reject(&ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            error_type: "MethodNotAllowed",
            message: format!("{method} is not allowed on {path}"),
        }),
    };
    if res.status().is_client_error() {
        tracing::debug!(slot = api.slot.index, status = res.status().as_u16(), path = %path, "runtime api request refused");
    }
    Ok(res)
}

/// The resources of the Runtime API.
#[derive(Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// `/runtime/invocation/next`.
    Next,
    /// `/runtime/invocation/{id}/response`.
    Response(&'a str),
    /// `/runtime/invocation/{id}/error`.
    Error(&'a str),
    /// `/runtime/init/error`.
    InitError,
    /// An API Lambda has and lambda mode does not (its name).
    Unsupported(&'static str),
    /// Anything else.
    Unknown,
}

/// Which resource `path` names.
pub fn route(path: &str) -> Route<'_> {
    if let Some(rest) = path.strip_prefix("/2018-06-01/runtime/") {
        if rest == "invocation/next" {
            return Route::Next;
        }
        if rest == "init/error" {
            return Route::InitError;
        }
        if rest.starts_with("restore/") {
            return Route::Unsupported("SnapStart restore API (/2018-06-01/runtime/restore)");
        }
        if let Some(inv) = rest.strip_prefix("invocation/") {
            if let Some((id, what)) = inv.split_once('/') {
                if !id.is_empty() && !what.contains('/') {
                    match what {
                        "response" => return Route::Response(id),
                        "error" => return Route::Error(id),
                        _ => {}
                    }
                }
            }
        }
        return Route::Unknown;
    }
    if path.starts_with("/2020-01-01/extension") {
        return Route::Unsupported("Extensions API (/2020-01-01/extension)");
    }
    if path.starts_with("/2022-07-01/telemetry") {
        return Route::Unsupported("Telemetry API (/2022-07-01/telemetry)");
    }
    if path.starts_with("/2020-08-15/logs") {
        return Route::Unsupported("Logs API (/2020-08-15/logs)");
    }
    Route::Unknown
}

/// `{"errorMessage", "errorType"}` with the error's status.
pub fn reject(e: &ApiError) -> ApiResponse {
    let body = serde_json::to_vec(&serde_json::json!({
        "errorMessage": e.message,
        "errorType": e.error_type,
    }))
    .unwrap_or_default();
    let mut res = hyper::Response::new(Full::new(Bytes::from(body)));
    *res.status_mut() = e.status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

/// 202 `{"status":"OK"}`, what Lambda answers an accepted response or error.
fn accepted() -> ApiResponse {
    let mut res = hyper::Response::new(Full::new(Bytes::from_static(b"{\"status\":\"OK\"}")));
    *res.status_mut() = StatusCode::ACCEPTED;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

/// Counts a `/next` as waiting until it is dropped (answered, or its connection went away).
struct Waiting<'a>(&'a Slot, u64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.next_done(self.1);
    }
}

async fn next(api: &Api) -> ApiResponse {
    let slot = &api.slot;
    let mut assigned = slot.subscribe();
    let event = match slot.next_begin() {
        Err(e) => return reject(&e),
        Ok(Ok(event)) => event,
        Ok(Err(generation)) => {
            let _waiting = Waiting(slot, generation);
            loop {
                if assigned.changed().await.is_err() {
                    return reject(&ApiError::invalid_transition("Stopped", "Ready"));
                }
                match slot.next_poll() {
                    Ok(Some(event)) => break event,
                    Ok(None) => continue,
                    Err(e) => return reject(&e),
                }
            }
        }
    };
    event_response(api, event)
}

fn event_response(api: &Api, e: NextEvent) -> ApiResponse {
    let mut res = hyper::Response::new(Full::new(e.event));
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(id) = HeaderValue::from_str(&e.id) {
        h.insert("lambda-runtime-aws-request-id", id);
    }
    h.insert(
        "lambda-runtime-deadline-ms",
        HeaderValue::from(e.deadline_ms),
    );
    h.insert(
        "lambda-runtime-invoked-function-arn",
        api.function_arn.clone(),
    );
    if let Some(trace) = e.trace_id {
        h.insert("lambda-runtime-trace-id", trace);
    }
    if let Some(context) = e.client_context {
        h.insert("lambda-runtime-client-context", context);
    }
    res
}

async fn response(api: &Api, id: &str, req: hyper::Request<Incoming>) -> ApiResponse {
    let streaming = match req.headers().get(RESPONSE_MODE) {
        None => false,
        Some(v) if v.as_bytes().eq_ignore_ascii_case(b"streaming") => true,
        Some(_) => {
            // Refused, and the invocation fails: the runtime asked for a mode that does not
            // exist, so no answer of it can be trusted.
            let reply = match api.slot.answer_begin(id, false) {
                Ok(reply) => reply,
                Err(e) => return reject(&e),
            };
            let _ = reply.send(Delivery::Failed(Failure::BadResponseMode));
            api.slot.answer_done(id);
            return reject(&ApiError {
                status: StatusCode::BAD_REQUEST,
                error_type: "InvalidFunctionResponseMode",
                message: "Invalid function response mode".into(),
            });
        }
    };
    let reply = match api.slot.answer_begin(id, false) {
        Ok(reply) => reply,
        Err(e) => return reject(&e),
    };
    let content_type = req.headers().get(CONTENT_TYPE).cloned();
    if streaming {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let _ = reply.send(Delivery::Stream(Streamed {
            content_type,
            chunks: rx,
        }));
        let res = stream(req.into_body(), tx).await;
        api.slot.answer_done(id);
        return res;
    }
    let read = if declared_length(&req).is_some_and(|n| n > MAX_PAYLOAD as u64) {
        drain(req.into_body()).await.map(|_| None)
    } else {
        read_capped(req.into_body(), MAX_PAYLOAD).await
    };
    let (delivery, res) = match read {
        Ok(Some(body)) => (Delivery::Result { body, content_type }, accepted()),
        Ok(None) => (Delivery::Failed(Failure::TooLarge), too_large()),
        Err(()) => (Delivery::Failed(Failure::Truncated), truncated()),
    };
    let _ = reply.send(delivery);
    api.slot.answer_done(id);
    res
}

/// Forwards a streamed response's frames to the client until it ends; data trailers with an
/// error end it as failed. The client going away does not stop the runtime: the rest of its
/// body is read and dropped, so its request completes.
async fn stream(mut body: Incoming, tx: mpsc::Sender<Chunk>) -> ApiResponse {
    let mut client = ToClient(Some(tx));
    let mut failed = None;
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    if !data.is_empty() {
                        client.send(Chunk::Data(data)).await;
                    }
                }
                Err(frame) => {
                    if let Some(trailers) = frame.trailers_ref() {
                        failed = result::trailer_error(trailers);
                    }
                }
            },
            Some(Err(_)) => {
                client.send(Chunk::Failed(None)).await;
                return truncated();
            }
        }
    }
    match failed {
        Some(err) => {
            tracing::warn!(
                error_type = %err.error_type,
                error_message = %err.message,
                "the function's streamed response ended with an error"
            );
            client.send(Chunk::Failed(Some(err))).await;
        }
        None => client.send(Chunk::End).await,
    }
    accepted()
}

/// The client's end of a stream, until it goes away.
struct ToClient(Option<mpsc::Sender<Chunk>>);

impl ToClient {
    async fn send(&mut self, chunk: Chunk) {
        if let Some(tx) = &self.0 {
            if tx.send(chunk).await.is_err() {
                self.0 = None;
            }
        }
    }
}

async fn error(api: &Api, id: &str, req: hyper::Request<Incoming>) -> ApiResponse {
    let reply = match api.slot.answer_begin(id, true) {
        Ok(reply) => reply,
        Err(e) => return reject(&e),
    };
    let header_type = error_type_header(&req);
    // Whole or not at all: a document cut short would lose its errorMessage and errorType.
    let read = match declared_length(&req) {
        Some(n) if n > MAX_PAYLOAD as u64 => drain(req.into_body()).await.map(|_| None),
        _ => read_capped(req.into_body(), MAX_PAYLOAD).await,
    };
    let (delivery, res) = match read {
        Ok(Some(body)) => (
            Delivery::Error(result::parse_error(header_type.as_deref(), body)),
            accepted(),
        ),
        Ok(None) => (Delivery::Failed(Failure::ErrorTooLarge), too_large()),
        Err(()) => (Delivery::Failed(Failure::Truncated), truncated()),
    };
    let _ = reply.send(delivery);
    api.slot.answer_done(id);
    res
}

async fn init_error(api: &Api, req: hyper::Request<Incoming>) -> ApiResponse {
    if let Err(e) = api.slot.init_error() {
        return reject(&e);
    }
    let header_type = error_type_header(&req);
    let body = read_error_body(req.into_body()).await.unwrap_or_default();
    let err = result::parse_error(header_type.as_deref(), body);
    tracing::warn!(
        slot = api.slot.index,
        error_type = %err.error_type,
        error_message = %err.message,
        "the runtime reported an init error"
    );
    api.shared.init_failed(&err);
    accepted()
}

/// The request's `Content-Length`, when it declares one.
fn declared_length(req: &hyper::Request<Incoming>) -> Option<u64> {
    req.headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

fn error_type_header(req: &hyper::Request<Incoming>) -> Option<String> {
    req.headers()
        .get(ERROR_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// Reads an error body, keeping at most [`MAX_ERROR_BODY`] of it.
async fn read_error_body(mut body: Incoming) -> Result<Bytes, ()> {
    let mut out = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| ())?;
        if let Ok(data) = frame.into_data() {
            let room = MAX_ERROR_BODY.saturating_sub(out.len());
            out.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    Ok(out.freeze())
}

/// The whole body if it is at most `cap` bytes (`None` when larger: the rest is read and
/// dropped up to [`MAX_DRAIN`]); `Err` when the request broke off.
async fn read_capped(mut body: Incoming, cap: usize) -> Result<Option<Bytes>, ()> {
    let mut out = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| ())?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > cap {
                drain(body).await?;
                return Ok(None);
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(Some(out.freeze()))
}

/// Reads and drops up to [`MAX_DRAIN`] bytes.
async fn drain(mut body: Incoming) -> Result<(), ()> {
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| ())?;
        if let Ok(data) = frame.into_data() {
            seen += data.len();
            if seen > MAX_DRAIN {
                return Ok(());
            }
        }
    }
    Ok(())
}

fn too_large() -> ApiResponse {
    reject(&ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        error_type: "RequestEntityTooLarge",
        message: format!("Exceeded maximum allowed payload size ({MAX_PAYLOAD} bytes)."),
    })
}

fn truncated() -> ApiResponse {
    reject(&ApiError {
        status: StatusCode::BAD_REQUEST,
        error_type: "TruncatedHTTPRequest",
        message: "HTTP request detected as truncated".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route("/2018-06-01/runtime/invocation/next"), Route::Next);
        assert_eq!(
            route("/2018-06-01/runtime/invocation/8476a536-e9f4/response"),
            Route::Response("8476a536-e9f4")
        );
        assert_eq!(
            route("/2018-06-01/runtime/invocation/abc/error"),
            Route::Error("abc")
        );
        assert_eq!(route("/2018-06-01/runtime/init/error"), Route::InitError);
        for unknown in [
            "/",
            "/2018-06-01/runtime/invocation//response",
            "/2018-06-01/runtime/invocation/a/b/response",
            "/2018-06-01/runtime/invocation/a/other",
            "/2018-06-01/runtime/invocation/next/x",
            "/2019-01-01/runtime/invocation/next",
        ] {
            assert_eq!(route(unknown), Route::Unknown, "{unknown}");
        }
        assert!(matches!(
            route("/2020-01-01/extension/register"),
            Route::Unsupported(name) if name.contains("Extensions API")
        ));
        assert!(matches!(
            route("/2022-07-01/telemetry"),
            Route::Unsupported(name) if name.contains("Telemetry API")
        ));
        assert!(matches!(route("/2020-08-15/logs"), Route::Unsupported(_)));
    }

    #[test]
    fn error_bodies() {
        let r = reject(&ApiError::invalid_request_id());
        assert_eq!(r.status(), 400);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/json");
        let r = reject(&ApiError::invalid_transition(
            "RuntimeResponseSentState",
            "InvocationResponse",
        ));
        assert_eq!(r.status(), 403);
    }
}
