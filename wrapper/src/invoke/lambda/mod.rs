//! lambda mode (`RUNR_WRAPPER_MODE=lambda`): AWS Lambda functions and custom runtimes run as
//! they are. The wrapper serves the Lambda Runtime API (`2018-06-01`, [`api`]) and starts
//! `RUNR_WORKERS` runtime processes ([`runtime`]), each with its own loopback port
//! (`AWS_LAMBDA_RUNTIME_API`) and state machine ([`slot`]), in its own process group.
//!
//! Each invocation becomes the event its trigger's AWS counterpart sends ([`events`]: API
//! Gateway HTTP API 2.0, SQS, EventBridge), waits in one queue for the next runtime that asks
//! for work (the wait counts in `RUNR_TIMEOUT`), and the runtime's answer becomes the HTTP
//! answer ([`result`]), streamed to the client as it comes when the runtime streams
//! ([`stream`]). With `RUNR_LAMBDA_INVOKE_API=1` the emulator's
//! `POST /2015-03-31/functions/function/invocations` takes a raw event and answers the raw
//! result.
//!
//! One runtime handles one invocation at a time, as in Lambda. Around it, everything the
//! other modes do: the timeout kills the runtime's process group and restarts it, a runtime
//! that exits mid-invocation answers 502 and is restarted, and the Runtime API's mistakes are
//! answered, never fatal.

pub(crate) mod api;
pub(crate) mod events;
mod md5;
pub(crate) mod result;
pub(crate) mod runtime;
pub(crate) mod slot;
pub(crate) mod stream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, StatusCode};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::{Ended, Invocation, Outcome};
use crate::config::{Config, Trigger};
use crate::observe::trace;
use crate::process::supervisor::{JobLine, Readiness, Sender, Settings, Supervisor};
use crate::request::Request;
use crate::response::{ErrorClass, Reply, OCTETS};
use api::Api;
use result::{FunctionError, Prelude};
use runtime::Runtime;
use slot::{Chunk, Delivery, Failure, Hold, Job, Slot, Streamed};
pub use stream::StreamedBody;

/// Largest event and largest buffered response, as Lambda's synchronous invocations.
pub const MAX_PAYLOAD: usize = 6 * 1024 * 1024;

/// The header the emulator's invoke API (and Lambda's) marks a function error with.
const FUNCTION_ERROR: HeaderName = HeaderName::from_static("x-amz-function-error");

/// The invoke API's client context: base64 of a JSON object (Lambda's `Invoke` parameter
/// `ClientContext`).
pub const CLIENT_CONTEXT: HeaderName = HeaderName::from_static("x-amz-client-context");

/// Longest `X-Amz-Client-Context` Lambda's `Invoke` takes, in bytes of base64.
const MAX_CLIENT_CONTEXT: usize = 3583;

/// What the slots share.
pub struct Shared {
    /// The invocations waiting for a runtime; a slot takes one when its runtime asks, and an
    /// invocation a runtime never saw goes back.
    line: Arc<JobLine<Job>>,
    /// How many runtimes are ready (the slots' states count them).
    readiness: Arc<Readiness>,
}

impl Shared {
    /// A runtime failed to initialise: when no runtime is ready, the invocations waiting are
    /// answered with that error (as Lambda answers the invocation whose init failed) instead
    /// of waiting for their timeout; new ones wait for the restart.
    pub fn init_failed(&self, err: &FunctionError) {
        if self.readiness.any() {
            return;
        }
        // A slot that is pulling holds the line, and a slot only pulls when it is ready.
        let failed = self.line.drain_now(|job| {
            let _ = job.reply.send(Delivery::Failed(Failure::Init(err.clone())));
        });
        if failed > 0 {
            tracing::warn!(
                invocations = failed,
                "answered the queued invocations with the init error"
            );
        }
    }
}

/// What kind of event a request becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Http,
    Queue,
    Schedule,
    /// The emulator's invoke API: the body is the event.
    InvokeApi,
}

/// What one invocation's run needs besides its request.
#[derive(Debug, Clone, Copy)]
struct Run {
    kind: Kind,
    deadline: Instant,
    /// `RUNR_TIMEOUT`, named in the 504.
    timeout: Duration,
}

/// An answer before it is observed.
enum Mapped {
    Whole(Outcome),
    Streamed {
        head: Reply,
        first: Bytes,
        chunks: mpsc::Receiver<Chunk>,
        deadline: Instant,
    },
}

/// The lambda-mode invoker.
pub struct Lambda {
    queue: Sender<Job>,
    shared: Arc<Shared>,
    supervisor: Supervisor,
    runtimes: usize,
    region: String,
    invoke_api: bool,
}

impl Lambda {
    /// Binds one Runtime API port per runtime on 127.0.0.1 and starts the runtimes. Must run
    /// inside the tokio runtime.
    pub fn start(config: &Config) -> std::io::Result<Lambda> {
        let Some(lc) = config.lambda.as_ref() else {
            return Err(std::io::Error::other(
                "lambda mode without its configuration",
            ));
        };
        let arn = HeaderValue::from_str(&lc.function_arn())
            .map_err(|_| std::io::Error::other("the function ARN is not a valid header value"))?;
        let line = Arc::new(JobLine::default());
        let readiness = Arc::new(Readiness::new(config.workers));
        let shared = Arc::new(Shared {
            line: line.clone(),
            readiness: readiness.clone(),
        });
        let mut slots = Vec::with_capacity(config.workers);
        for index in 0..config.workers {
            let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
            listener.set_nonblocking(true)?;
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let addr = listener.local_addr()?;
            let slot = Arc::new(Slot::new(index, readiness.clone()));
            let api = Arc::new(Api {
                slot: slot.clone(),
                function_arn: arn.clone(),
                shared: shared.clone(),
            });
            // No header-read timeout: a runtime's connection waits between invocations, and
            // the port is loopback-only. Never shut down: the tasks end with the runtime.
            tokio::spawn(runr_base::serve::serve_connections(
                listener,
                http1::Builder::new(),
                std::future::pending(),
                Duration::ZERO,
                move |_, _| {
                    let api = api.clone();
                    service_fn(move |req| api::handle(api.clone(), req))
                },
            ));
            slots.push((slot, addr.to_string()));
        }
        let spec = Arc::new(runtime::Spec {
            command: config.command.clone(),
            cwd: lc.task_root.clone(),
            env: runtime::environment(lc, runtime::memory_mib()),
            version: lc.function_version.clone(),
            slots,
            shared: shared.clone(),
        });
        // The slots' states count the runtimes ready (at their first `/next`); a runtime
        // has no ready wait and no recycling.
        let settings = Settings {
            slots: config.workers,
            ..Settings::default()
        };
        let supervisor = Supervisor::start::<Runtime>(settings, spec, line.clone());
        tracing::info!(
            runtimes = config.workers,
            function = %lc.function_name,
            region = %lc.region,
            invoke_api = lc.invoke_api,
            "serving the Lambda Runtime API"
        );
        Ok(Lambda {
            queue: line.sender(),
            shared,
            supervisor,
            runtimes: config.workers,
            region: lc.region.clone(),
            invoke_api: lc.invoke_api,
        })
    }

    /// True when at least one runtime is initialised (asked for an invocation): probes answer
    /// 503 until then, and while every runtime is failing its init.
    pub fn ready(&self) -> bool {
        self.shared.readiness.any()
    }

    /// The runtime processes (`RUNR_WORKERS`): one invocation each at a time, so the server
    /// admits that many.
    pub fn runtimes(&self) -> usize {
        self.runtimes
    }

    /// Runs `inv` (its body read) by its deadline: its answer whole, or its head with a body
    /// the runtime streams (an HTTP client's; the schedule one-shot's is collected, up to
    /// [`MAX_PAYLOAD`]). The admission slot stays with the invocation while it occupies a
    /// runtime.
    pub async fn invoke(&self, inv: &mut Invocation) -> Outcome {
        let req = inv.request().clone();
        let kind = self.kind_of(&req);
        let client_context = match kind {
            Kind::InvokeApi => match client_context(&req.headers) {
                Ok(context) => context,
                Err(message) => {
                    return Outcome::refused(Reply::failure(
                        ErrorClass::Request,
                        StatusCode::BAD_REQUEST,
                        message,
                    ))
                }
            },
            _ => None,
        };
        if req.body.len() > MAX_PAYLOAD {
            // Lambda's limit, below the server's own.
            return Outcome::refused(Reply::failure(
                ErrorClass::Limit,
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body exceeds 6 MiB",
            ));
        }
        let next = NextHeaders {
            trace_id: inv.traced().then(|| xray_trace_id(&req.headers)).flatten(),
            client_context,
        };
        let (source_ip, protocol) = match inv.client() {
            Some(client) => (
                source_ip(&req.headers, client.peer),
                match client.version {
                    http::Version::HTTP_10 => "HTTP/1.0",
                    _ => "HTTP/1.1",
                },
            ),
            None => ("127.0.0.1".to_string(), "HTTP/1.1"),
        };
        let ctx = events::HttpContext {
            source_ip: &source_ip,
            protocol,
            now: SystemTime::now() - inv.arrived().elapsed(),
        };
        let hold = Hold::new(inv.take_slot());
        let timeout = inv.timeout();
        let run = Run {
            kind,
            deadline: inv.deadline(),
            timeout,
        };
        match self.run(&run, &req, &ctx, next, hold).await {
            Mapped::Whole(outcome) => outcome,
            Mapped::Streamed {
                head,
                first,
                chunks,
                deadline,
            } if inv.may_stream() => Outcome {
                stream: Some(StreamedBody::new(first, chunks, deadline)),
                ..Outcome::answered(head)
            },
            Mapped::Streamed {
                head,
                first,
                mut chunks,
                deadline,
            } => match collect(first, &mut chunks, deadline).await {
                Ok(body) => Outcome::answered(Reply { body, ..head }),
                Err(failure) => failed(failure, timeout),
            },
        }
    }

    /// Stops every runtime (SIGTERM to its group, SIGKILL after 5 s). Call after the server
    /// has drained.
    pub async fn shutdown(&self) {
        self.supervisor.stop().await;
    }

    fn kind_of(&self, req: &Request) -> Kind {
        if self.invoke_api && req.method == "POST" && is_invoke_path(&req.path) {
            return Kind::InvokeApi;
        }
        match req.trigger {
            Trigger::Http => Kind::Http,
            Trigger::Queue => Kind::Queue,
            Trigger::Schedule => Kind::Schedule,
        }
    }

    /// Builds the event, queues it and maps what comes back.
    async fn run(
        &self,
        run: &Run,
        req: &Request,
        ctx: &events::HttpContext<'_>,
        next: NextHeaders,
        hold: Hold,
    ) -> Mapped {
        let Run { kind, deadline, .. } = *run;
        let (event, message_id) = match kind {
            Kind::Http => (events::http_event(req, ctx), String::new()),
            Kind::Queue => events::sqs_event(req, &self.region, ctx.now),
            Kind::Schedule => (
                events::schedule_event(req, &self.region, ctx.now),
                String::new(),
            ),
            Kind::InvokeApi => (req.body.to_vec(), String::new()),
        };
        if event.len() > MAX_PAYLOAD {
            return Mapped::Whole(Outcome::answered(Reply::failure(
                ErrorClass::Limit,
                StatusCode::PAYLOAD_TOO_LARGE,
                "the event payload exceeds 6 MiB",
            )));
        }
        let (tx, rx) = oneshot::channel();
        let job = Job {
            id: request_id(),
            event: Bytes::from(event),
            deadline,
            deadline_ms: runr_base::fmt::unix_millis(
                SystemTime::now() + deadline.saturating_duration_since(Instant::now()),
            ),
            trace_id: next.trace_id,
            client_context: next.client_context,
            reply: tx,
            hold,
        };
        if self.queue.send(job).is_err() {
            return Mapped::Whole(unavailable());
        }
        let delivery = match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(delivery)) => delivery,
            Ok(Err(_dropped)) => return Mapped::Whole(unavailable()),
            Err(_elapsed) => return Mapped::Whole(Outcome::timed_out(run.timeout)),
        };
        match delivery {
            Delivery::Failed(failure) => Mapped::Whole(failed(failure, run.timeout)),
            Delivery::Error(err) => Mapped::Whole(function_error(kind, &err)),
            Delivery::Result { body, content_type } => Mapped::Whole(Outcome::answered(
                self.result(kind, &body, content_type, &message_id),
            )),
            Delivery::Stream(streamed) => self.streamed(run, streamed, &message_id).await,
        }
    }

    fn result(
        &self,
        kind: Kind,
        body: &Bytes,
        content_type: Option<HeaderValue>,
        message_id: &str,
    ) -> Reply {
        match kind {
            Kind::Http => result::http_reply(body),
            Kind::Queue => result::queue_reply(body, message_id),
            Kind::Schedule => result::plain_reply(body, None),
            Kind::InvokeApi => result::plain_reply(body, content_type.as_ref()),
        }
    }

    /// A streamed response: an http event's HTTP-integration prelude gives the head (a stream
    /// without one answers 200 with its content type); queue and schedule results are
    /// collected and read as a whole.
    async fn streamed(&self, run: &Run, s: Streamed, message_id: &str) -> Mapped {
        let Run {
            kind,
            deadline,
            timeout,
        } = *run;
        let Streamed {
            content_type,
            mut chunks,
        } = s;
        match kind {
            Kind::Queue | Kind::Schedule => {
                match collect(Bytes::new(), &mut chunks, deadline).await {
                    Ok(body) => Mapped::Whole(Outcome::answered(self.result(
                        kind,
                        &body,
                        content_type,
                        message_id,
                    ))),
                    Err(failure) => Mapped::Whole(failed(failure, timeout)),
                }
            }
            Kind::Http | Kind::InvokeApi => {
                let prelude = kind == Kind::Http
                    && content_type.as_ref().is_some_and(|ct| {
                        ct.as_bytes()
                            .starts_with(result::HTTP_INTEGRATION.as_bytes())
                    });
                if !prelude {
                    let ct = content_type.unwrap_or(HeaderValue::from_static(OCTETS));
                    return Mapped::Streamed {
                        head: Reply {
                            status: StatusCode::OK,
                            headers: vec![(CONTENT_TYPE, ct)],
                            body: Bytes::new(),
                        },
                        first: Bytes::new(),
                        chunks,
                        deadline,
                    };
                }
                match tokio::time::timeout_at(deadline, read_prelude(&mut chunks)).await {
                    Err(_elapsed) => Mapped::Whole(Outcome::timed_out(timeout)),
                    Ok(Err(failure)) => Mapped::Whole(failed(failure, timeout)),
                    Ok(Ok(PreludeRead::Invalid(reason))) => Mapped::Whole(Outcome::answered(
                        Reply::failure(ErrorClass::Crash, StatusCode::BAD_GATEWAY, &reason),
                    )),
                    Ok(Ok(PreludeRead::Error(err))) => Mapped::Whole(function_error(kind, &err)),
                    Ok(Ok(PreludeRead::Head { head, first })) => Mapped::Streamed {
                        head,
                        first,
                        chunks,
                        deadline,
                    },
                }
            }
        }
    }
}

/// The answer to an invocation whose runtime failed it; `timeout` is `RUNR_TIMEOUT`.
fn failed(failure: Failure, timeout: Duration) -> Outcome {
    match failure {
        Failure::Exited(_) => Outcome::failed(
            Ended::WorkerExited,
            StatusCode::BAD_GATEWAY,
            "handler process exited",
        ),
        Failure::TooLarge => Outcome::failed(
            Ended::OutputTooLarge,
            StatusCode::BAD_GATEWAY,
            "the function's response exceeds 6 MiB",
        ),
        Failure::ErrorTooLarge => Outcome::failed(
            Ended::OutputTooLarge,
            StatusCode::BAD_GATEWAY,
            "the function's error document exceeds 6 MiB",
        ),
        Failure::Truncated => Outcome::failed(
            Ended::WorkerExited,
            StatusCode::BAD_GATEWAY,
            "the function's response was cut off",
        ),
        Failure::BadResponseMode => Outcome::answered(Reply::failure(
            ErrorClass::Crash,
            StatusCode::BAD_GATEWAY,
            "the runtime sent an invalid Lambda-Runtime-Function-Response-Mode",
        )),
        Failure::Init(err) => Outcome {
            ended: Ended::FailedToStart,
            ..Outcome::answered(result::init_error_reply(&err))
        },
        Failure::TimedOut => Outcome::timed_out(timeout),
    }
}

fn unavailable() -> Outcome {
    Outcome::failed(
        Ended::Unavailable,
        StatusCode::SERVICE_UNAVAILABLE,
        "no runtime process is available",
    )
}

/// A function error: 502 `{"error", "errorType"}`; on the invoke API, 200 with the error
/// document and `X-Amz-Function-Error: Unhandled`, as Lambda's Invoke answers.
fn function_error(kind: Kind, err: &FunctionError) -> Outcome {
    if kind != Kind::InvokeApi {
        return Outcome::answered(result::error_reply(err));
    }
    let is_object =
        serde_json::from_slice::<serde_json::Value>(&err.body).is_ok_and(|v| v.is_object());
    let body = if is_object {
        err.body.clone()
    } else {
        FunctionError::new(&err.error_type, err.message.clone()).body
    };
    let mut reply = Reply::with_type(StatusCode::OK, crate::response::JSON, body);
    reply
        .headers
        .push((FUNCTION_ERROR, HeaderValue::from_static("Unhandled")));
    Outcome::answered(reply)
}

/// What a runtime's `/next` carries besides the event, per invocation.
#[derive(Debug, Default)]
struct NextHeaders {
    /// `Lambda-Runtime-Trace-Id`.
    trace_id: Option<HeaderValue>,
    /// `Lambda-Runtime-Client-Context`.
    client_context: Option<HeaderValue>,
}

/// The invoke API's `X-Amz-Client-Context` as the runtime reads it in
/// `Lambda-Runtime-Client-Context`: decoded from base64 to the JSON object itself, as the
/// emulator passes it (awslambdaric parses it into `context.client_context`). `Err`: why the
/// request is refused (400).
pub fn client_context(headers: &HeaderMap) -> Result<Option<HeaderValue>, &'static str> {
    use base64::Engine;
    let Some(value) = headers.get(CLIENT_CONTEXT).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if value.len() > MAX_CLIENT_CONTEXT {
        return Err("X-Amz-Client-Context is longer than 3583 bytes");
    }
    const NOT_BASE64_JSON: &str = "X-Amz-Client-Context must be a base64-encoded JSON object";
    let json = base64::engine::general_purpose::STANDARD
        .decode(value.as_bytes().trim_ascii())
        .map_err(|_| NOT_BASE64_JSON)?;
    match serde_json::from_slice::<serde_json::Value>(&json) {
        // As sent when a header can carry it; written on one line when it cannot.
        Ok(object @ serde_json::Value::Object(_)) => HeaderValue::from_bytes(json.trim_ascii())
            .or_else(|_| HeaderValue::from_bytes(object.to_string().as_bytes()))
            .map(Some)
            .map_err(|_| NOT_BASE64_JSON),
        _ => Err(NOT_BASE64_JSON),
    }
}

/// How the start of an HTTP-integration stream read.
enum PreludeRead {
    Head { head: Reply, first: Bytes },
    Invalid(String),
    Error(FunctionError),
}

async fn read_prelude(chunks: &mut mpsc::Receiver<Chunk>) -> Result<PreludeRead, Failure> {
    let mut start = BytesMut::new();
    loop {
        match chunks.recv().await {
            Some(Chunk::Data(data)) => {
                start.extend_from_slice(&data);
                match result::split_prelude(&start) {
                    Prelude::NeedMore => {}
                    Prelude::Invalid(reason) => return Ok(PreludeRead::Invalid(reason)),
                    Prelude::Head { reply, consumed } => {
                        let first = start.split_off(consumed).freeze();
                        return Ok(PreludeRead::Head { head: reply, first });
                    }
                }
            }
            Some(Chunk::End) => {
                return Ok(PreludeRead::Invalid(
                    "the streamed response ended before its prelude".into(),
                ))
            }
            Some(Chunk::Failed(Some(err))) => return Ok(PreludeRead::Error(err)),
            Some(Chunk::Failed(None)) | None => return Err(Failure::Truncated),
        }
    }
}

/// A whole streamed body, at most [`MAX_PAYLOAD`] bytes.
async fn collect(
    first: Bytes,
    chunks: &mut mpsc::Receiver<Chunk>,
    deadline: Instant,
) -> Result<Bytes, Failure> {
    let mut out = BytesMut::from(&first[..]);
    let read = async {
        loop {
            match chunks.recv().await {
                Some(Chunk::Data(data)) => {
                    if out.len() + data.len() > MAX_PAYLOAD {
                        return Err(Failure::TooLarge);
                    }
                    out.extend_from_slice(&data);
                }
                Some(Chunk::End) => return Ok(()),
                Some(Chunk::Failed(_)) | None => return Err(Failure::Truncated),
            }
        }
    };
    match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(())) => Ok(out.freeze()),
        Ok(Err(failure)) => Err(failure),
        Err(_elapsed) => Err(Failure::TimedOut),
    }
}

/// A fresh `Lambda-Runtime-Aws-Request-Id`, UUID-shaped (version 4, RFC 9562 variant): a random
/// per-process value with a counter folded in, so ids never repeat within the process and an
/// invocation costs no system call for randomness.
fn request_id() -> Arc<str> {
    static BASE: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut b = *BASE.get_or_init(|| {
        let mut b = [0u8; 16];
        runr_base::fmt::random_bytes(&mut b);
        b
    });
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // The counter goes into the last six bytes, which the version and variant bits leave alone.
    for (byte, c) in b[10..].iter_mut().zip(&n.to_be_bytes()[2..]) {
        *byte ^= c;
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = runr_base::fmt::hex(&b);
    Arc::from(format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

/// `/2015-03-31/functions/<name>/invocations`.
fn is_invoke_path(path: &str) -> bool {
    path.strip_prefix("/2015-03-31/functions/")
        .and_then(|rest| rest.strip_suffix("/invocations"))
        .is_some_and(|name| !name.is_empty() && !name.contains('/'))
}

/// The client's address: the first `X-Forwarded-For` entry when a proxy in front set one (the
/// queue-proxy of Knative does), else the connection's peer.
fn source_ip(headers: &HeaderMap, peer: SocketAddr) -> String {
    headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(str::trim)
        .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
        .map(str::to_string)
        .unwrap_or_else(|| peer.ip().to_string())
}

/// `Lambda-Runtime-Trace-Id` in X-Ray's form, from the `traceparent` the invocation carries
/// (the wrapper's span when tracing is on): `Root=1-<8 hex>-<24 hex>;Parent=<16 hex>;Sampled=<0|1>`.
fn xray_trace_id(headers: &HeaderMap) -> Option<HeaderValue> {
    let tp = headers.get(trace::TRACEPARENT)?.to_str().ok()?;
    let parent = trace::parse_traceparent(tp)?;
    let id = runr_base::fmt::hex(&parent.trace_id);
    let value = format!(
        "Root=1-{}-{};Parent={};Sampled={}",
        &id[..8],
        &id[8..],
        runr_base::fmt::hex(&parent.span_id),
        u8::from(parent.sampled)
    );
    HeaderValue::from_str(&value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_uuid_shaped_and_unique() {
        let ids: std::collections::HashSet<Arc<str>> = (0..10_000).map(|_| request_id()).collect();
        assert_eq!(ids.len(), 10_000);
        for id in ids.iter().take(50) {
            let parts: Vec<&str> = id.split('-').collect();
            assert_eq!(
                parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
                [8, 4, 4, 4, 12]
            );
            assert!(parts[2].starts_with('4'), "{id}");
            assert!(
                matches!(parts[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'),
                "{id}"
            );
        }
    }

    #[test]
    fn client_contexts_are_base64_json_objects_passed_decoded() {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let of = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(CLIENT_CONTEXT, HeaderValue::from_str(v).unwrap());
            client_context(&h)
        };
        assert_eq!(client_context(&HeaderMap::new()), Ok(None));
        assert_eq!(of(""), Ok(None));
        let custom = r#"{"custom":{"foo":"bar","baz":123}}"#;
        assert_eq!(of(&b64(custom)).unwrap().unwrap(), custom);
        // A document over several lines goes on one.
        let pretty = "{\n  \"custom\": {\"a\": 1}\n}";
        assert_eq!(of(&b64(pretty)).unwrap().unwrap(), r#"{"custom":{"a":1}}"#);
        for bad in [
            b64("[1]"),
            b64("not json"),
            "%%%".to_string(),
            "x".repeat(3584),
        ] {
            assert!(of(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn invoke_paths() {
        assert!(is_invoke_path("/2015-03-31/functions/function/invocations"));
        assert!(is_invoke_path("/2015-03-31/functions/orders/invocations"));
        for no in [
            "/2015-03-31/functions//invocations",
            "/2015-03-31/functions/a/b/invocations",
            "/2015-03-31/functions/function/invocation",
            "/",
        ] {
            assert!(!is_invoke_path(no), "{no}");
        }
    }

    #[test]
    fn source_ips() {
        let peer: SocketAddr = "10.0.0.9:5555".parse().unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(source_ip(&h, peer), "10.0.0.9");
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_static(" 203.0.113.7 , 10.0.0.1"),
        );
        assert_eq!(source_ip(&h, peer), "203.0.113.7");
        h.insert("x-forwarded-for", HeaderValue::from_static("garbage"));
        assert_eq!(source_ip(&h, peer), "10.0.0.9");
    }

    #[test]
    fn xray_ids_from_traceparents() {
        let mut h = HeaderMap::new();
        assert_eq!(xray_trace_id(&h), None);
        h.insert(
            trace::TRACEPARENT,
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        assert_eq!(
            xray_trace_id(&h).unwrap(),
            "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=1"
        );
    }

    #[test]
    fn invoke_api_errors_are_200_with_the_error_document() {
        let err = result::parse_error(
            None,
            Bytes::from_static(br#"{"errorMessage":"boom","errorType":"E","stackTrace":[]}"#),
        );
        let o = function_error(Kind::InvokeApi, &err);
        assert_eq!(o.reply.status, 200);
        assert_eq!(o.reply.body, err.body);
        assert!(o
            .reply
            .headers
            .iter()
            .any(|(n, v)| n == "x-amz-function-error" && v == "Unhandled"));
        let o = function_error(Kind::Http, &err);
        assert_eq!(o.reply.status, 502);
    }
}
