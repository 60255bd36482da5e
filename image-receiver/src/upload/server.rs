//! The HTTP API the control plane talks to (through the Kubernetes API server's service
//! proxy): `GET /status`, `PUT /chunk?offset=N`, `POST /complete`, `GET /healthz`. Every answer
//! is JSON; refusals are `{"error": "...", "code": "..."}`.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioTimer;
use runr_base::serve::serve_connections;
use tokio::net::TcpListener;

use super::{ChunkError, Completion, Processor, Upload};

/// How long an accepted connection may be idle before the kernel probes the peer, then how often,
/// and how many unanswered probes end it: a peer that vanished without a FIN (a proxy leg that
/// died) is found in about a minute instead of holding the connection forever.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 3;

/// How long in-flight requests get to finish after SIGTERM.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// Chunk bytes are handed to the disk in batches of about this size: large enough that the
/// hop to a blocking thread is rare, small enough that a request holds little memory.
const WRITE_BATCH: usize = 1024 * 1024;

/// Batch buffers in use at most: a chunk that finds none free writes its frames one by one
/// (each at most hyper's read buffer, [`READ_BUFFER`]) instead, so memory does not grow with the
/// number of concurrent chunks (64 chunks with a batch each held 64 MiB).
const BATCH_BUFFERS: usize = 8;

/// Batch buffers kept for reuse once their chunk is done.
const POOLED_BUFFERS: usize = 4;

/// Largest read buffer hyper may grow to per connection. Below musl's mmap threshold (~128
/// KiB) on purpose: hyper allocates a new read buffer as frames are split off it, and buffers
/// above the threshold are fresh mmaps whose pages fault in for every byte received (measured:
/// ~1,100 mmap/munmap pairs and ~235,000 page faults per GiB with a 1 MiB buffer).
const READ_BUFFER: usize = 64 * 1024;

/// What every request shares.
struct Ctx {
    upload: Arc<Upload>,
    processor: Processor,
    /// `RUNR_UPLOAD_CHUNK_IDLE`.
    chunk_idle: Duration,
    /// Batch buffers of finished chunks, for the next ones.
    buffers: Mutex<Vec<Vec<u8>>>,
    /// One permit per batch buffer that may exist ([`BATCH_BUFFERS`]).
    batch_slots: Arc<tokio::sync::Semaphore>,
}

impl Ctx {
    /// A batch buffer and the permit it needs; `None` when [`BATCH_BUFFERS`] are in use.
    fn take_buffer(&self) -> Option<(Vec<u8>, tokio::sync::OwnedSemaphorePermit)> {
        let permit = self.batch_slots.clone().try_acquire_owned().ok()?;
        let pooled = self.buffers.lock().ok().and_then(|mut b| b.pop());
        Some((
            pooled.unwrap_or_else(|| Vec::with_capacity(WRITE_BATCH)),
            permit,
        ))
    }

    fn give_buffer(&self, mut buf: Vec<u8>) {
        buf.clear();
        if buf.capacity() >= WRITE_BATCH {
            if let Ok(mut pool) = self.buffers.lock() {
                if pool.len() < POOLED_BUFFERS {
                    pool.push(buf);
                }
            }
        }
    }
}

/// How a chunk's body ended, when not well.
enum ChunkEnd {
    /// The connection broke or the framing was bad.
    Broken(hyper::Error),
    /// No byte arrived for `RUNR_UPLOAD_CHUNK_IDLE`.
    Idle,
    /// A limit was hit or the write failed.
    Refused(ChunkError),
}
use ChunkEnd::{Broken, Idle, Refused};

impl From<ChunkError> for ChunkEnd {
    fn from(e: ChunkError) -> Self {
        Refused(e)
    }
}

/// Serves `listener` until `shutdown` completes, then stops accepting and waits up to
/// [`DRAIN_LIMIT`] for in-flight requests. Background work is not waited for: its state is on
/// disk and a restarted receiver takes it up again.
pub async fn run(
    listener: TcpListener,
    upload: Arc<Upload>,
    processor: Processor,
    chunk_idle: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let ctx = Arc::new(Ctx {
        upload,
        processor,
        chunk_idle,
        buffers: Mutex::new(Vec::new()),
        batch_slots: Arc::new(tokio::sync::Semaphore::new(BATCH_BUFFERS)),
    });
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let mut http = http1::Builder::new();
    // The timer gives hyper its header-read timeout (slow clients cannot pin a task).
    http.timer(TokioTimer::new());
    http.max_buf_size(READ_BUFFER);
    serve_connections(
        listener,
        http,
        shutdown,
        DRAIN_LIMIT,
        move |stream, peer| {
            if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
                tracing::debug!(error = %e, %peer, "cannot enable TCP keepalive");
            }
            let ctx = ctx.clone();
            service_fn(move |req| handle(ctx.clone(), req))
        },
    )
    .await;
}

type Reply = Response<Full<Bytes>>;

async fn handle(ctx: Arc<Ctx>, req: Request<Incoming>) -> Result<Reply, Infallible> {
    let reply = match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/healthz") => json(StatusCode::OK, &Ok200 { ok: true }),
        (&Method::GET | &Method::HEAD, "/status") => json(StatusCode::OK, &ctx.upload.status()),
        (&Method::PUT, "/chunk") => chunk(&ctx, req).await,
        (&Method::POST, "/complete") => complete(&ctx),
        (_, "/healthz" | "/status" | "/chunk" | "/complete") => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "GET /status, PUT /chunk?offset=N, POST /complete, GET /healthz",
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such endpoint: GET /status, PUT /chunk?offset=N, POST /complete, GET /healthz",
        ),
    };
    Ok(reply)
}

#[derive(serde::Serialize)]
struct Ok200 {
    ok: bool,
}

/// `PUT /chunk?offset=N`: refusals from the headers first (before a byte of the body is read),
/// then the body streams to the data file in batches, bounded as it comes when the client sent
/// no Content-Length.
async fn chunk(ctx: &Ctx, req: Request<Incoming>) -> Reply {
    let Some(offset) = parse_offset(req.uri().query()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_offset",
            "expected ?offset=N with N the chunk's byte offset in the file (a whole number)",
        );
    };
    let len = req.body().size_hint().exact();
    let mut writer = match ctx.upload.begin_chunk(offset, len) {
        Ok(w) => w,
        Err(e) => return chunk_error(e),
    };
    let mut body = req.into_body();
    // Frames are copied into a pooled buffer at once: hyper then reuses its read buffer, where
    // holding the frames would make it allocate (and fault in) fresh memory for every byte.
    // Without a free batch buffer, each frame goes to the file as it comes (a small write).
    let mut slot = ctx.take_buffer();
    let result = async {
        loop {
            // Bounded wait per frame: a body that stops arriving must not keep its claims.
            let frame = match tokio::time::timeout(ctx.chunk_idle, body.frame()).await {
                Err(_) => return Err(Idle),
                Ok(None) => break,
                Ok(Some(Ok(frame))) => frame,
                Ok(Some(Err(e))) => return Err(Broken(e)),
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers carry nothing for us
            };
            let Some((batch, _)) = &mut slot else {
                writer.write_small(&data).await?;
                continue;
            };
            writer.check_room((batch.len() + data.len()) as u64)?;
            if !batch.is_empty() && batch.len() + data.len() > WRITE_BATCH {
                *batch = writer.write(std::mem::take(batch)).await?;
            }
            batch.extend_from_slice(&data);
        }
        if let Some((batch, _)) = &mut slot {
            if !batch.is_empty() {
                *batch = writer.write(std::mem::take(batch)).await?;
            }
        }
        Ok(())
    }
    .await;
    if let Some((batch, permit)) = slot {
        ctx.give_buffer(batch);
        drop(permit);
    }
    match result {
        Ok(()) => {}
        Err(Broken(e)) => {
            // The client went away mid-chunk: nothing of it is recorded (the writer releases
            // its claims), and the client sends the chunk again.
            tracing::debug!(error = %e, offset, "chunk body ended early");
            return error(
                StatusCode::BAD_REQUEST,
                "bad_chunk",
                "the chunk's body ended early; send it again",
            );
        }
        Err(Idle) => {
            // Dropping the writer below releases what the chunk reserved; the `Connection:
            // close` makes hyper end the connection instead of waiting for the rest.
            drop(writer);
            let idle = runr_base::env::display_duration(ctx.chunk_idle);
            tracing::info!(offset, %idle, "chunk body stalled: dropped, connection closed");
            let mut reply = error(
                StatusCode::REQUEST_TIMEOUT,
                "chunk_idle",
                &format!(
                    "no byte of the chunk arrived for {idle}: the chunk was dropped (nothing of \
                     it is kept) and the connection closed; send it again"
                ),
            );
            reply
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            return reply;
        }
        Err(Refused(e)) => return chunk_error(e),
    }
    let len = writer.written();
    match writer.finish() {
        Ok(status) => {
            tracing::debug!(
                offset,
                len,
                uploaded_bytes = status.uploaded_bytes,
                received_bytes = status.received_bytes,
                "chunk stored"
            );
            json(StatusCode::OK, &status)
        }
        Err(e) => chunk_error(e),
    }
}

/// `POST /complete`.
fn complete(ctx: &Ctx) -> Reply {
    match ctx.upload.complete(&ctx.processor) {
        Completion::Incomplete { uploaded_bytes } => json(
            StatusCode::CONFLICT,
            &serde_json::json!({
                "error": format!(
                    "the upload is not complete: {uploaded_bytes} of {} bytes are there from \
                     the start without a gap; send the rest, then complete again",
                    ctx.upload.size()
                ),
                "code": "upload_incomplete",
                "uploaded_bytes": uploaded_bytes,
            }),
        ),
        Completion::Working(status) => json(StatusCode::ACCEPTED, &status),
        Completion::Done(status) => json(StatusCode::OK, &status),
    }
}

/// The offset of `offset=N` in the query, a plain decimal number.
pub(crate) fn parse_offset(query: Option<&str>) -> Option<u64> {
    let value = query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("offset="))?;
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

fn chunk_error(e: ChunkError) -> Reply {
    let (status, code) = match &e {
        ChunkError::Closed(_) => (StatusCode::CONFLICT, "upload_closed"),
        ChunkError::Reopened => (StatusCode::CONFLICT, "upload_reopened"),
        ChunkError::OutOfRange { .. } => (StatusCode::RANGE_NOT_SATISFIABLE, "chunk_out_of_range"),
        ChunkError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "chunk_too_large"),
        ChunkError::Write { .. } => {
            tracing::error!(error = %runr_base::fmt::error_chain(&e), "cannot store a chunk");
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "write_failed",
                "the receiver cannot store the chunk (is its volume full?); see its log",
            );
        }
    };
    error(status, code, &e.to_string())
}

fn error(status: StatusCode, code: &str, message: &str) -> Reply {
    json(
        status,
        &serde_json::json!({ "error": message, "code": code }),
    )
}

fn json(status: StatusCode, body: &impl serde::Serialize) -> Reply {
    let body = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut reply = Response::new(Full::new(Bytes::from(body)));
    *reply.status_mut() = status;
    reply
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets() {
        assert_eq!(parse_offset(Some("offset=0")), Some(0));
        assert_eq!(parse_offset(Some("x=1&offset=8388608")), Some(8_388_608));
        for bad in [
            None,
            Some(""),
            Some("offset="),
            Some("offset=-1"),
            Some("offset=1e3"),
            Some("offset=+5"),
            Some("offset=18446744073709551616"),
            Some("off=1"),
        ] {
            assert_eq!(parse_offset(bad), None, "{bad:?}");
        }
    }
}
