//! Waiting for a server to listen, and sending it the event over one HTTP/1.1 connection.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::config::Target;
use crate::event::{ScheduleEvent, BODY};

/// First pause between two connection attempts; it doubles up to [`MAX_RETRY_PAUSE`].
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(5);
/// Longest pause between two connection attempts.
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Upper bound of one connection attempt, so a black-holed address cannot eat the whole wait.
const CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a tick was not answered.
#[derive(Debug, thiserror::Error)]
pub enum TickError {
    /// Nothing accepted a connection before the wait ran out.
    #[error("nothing listens on {target} after waiting {waited:?}")]
    NotListening {
        /// Where we tried.
        target: String,
        /// How long we tried.
        waited: Duration,
    },
    /// The HTTP exchange failed (connection reset, malformed response, ...).
    #[error("sending the schedule event to {target} failed")]
    Request {
        /// Where we sent it.
        target: String,
        /// What hyper saw.
        #[source]
        source: hyper::Error,
    },
    /// The request could not be built from the target (a path with bad characters).
    #[error("cannot build a request for {target}")]
    BuildRequest {
        /// The target.
        target: String,
        /// What http rejected.
        #[source]
        source: http::Error,
    },
}

/// The server's answer to a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TickResponse {
    /// HTTP status code.
    pub status: u16,
    /// The whole response body.
    pub body: Bytes,
}

impl TickResponse {
    /// The exit status of the tick commands: 0 for a status below 400, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        let exit = match self.status {
            ..=399 => runr_base::cli::Exit::Done,
            _ => runr_base::cli::Exit::Failed,
        };
        exit.code()
    }
}

/// Connects to `target`, retrying until it accepts a connection or `wait` has passed; returns the
/// connected stream so the event goes over the connection that proved the server is up.
pub async fn wait_for_listener(target: &Target, wait: Duration) -> Result<TcpStream, TickError> {
    let start = Instant::now();
    let deadline = start + wait;
    let mut pause = FIRST_RETRY_PAUSE;
    loop {
        // Resolution is retried too: in a fresh pod DNS may come up after the CronJob's container.
        let attempt = TcpStream::connect((target.host.as_str(), target.port));
        if let Ok(Ok(stream)) = tokio::time::timeout(CONNECT_ATTEMPT_TIMEOUT, attempt).await {
            let _ = stream.set_nodelay(true);
            return Ok(stream);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(TickError::NotListening {
                target: target.to_string(),
                waited: now - start,
            });
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(MAX_RETRY_PAUSE);
    }
}

/// POSTs `event` in binary content mode over `stream` and reads the whole answer.
pub async fn send(
    stream: TcpStream,
    target: &Target,
    event: &ScheduleEvent,
) -> Result<TickResponse, TickError> {
    send_with(stream, target, event, &[]).await
}

/// [`send`] with `extra` headers (the wrapper adds its `traceparent`).
pub async fn send_with(
    stream: TcpStream,
    target: &Target,
    event: &ScheduleEvent,
    extra: &[(&str, &str)],
) -> Result<TickResponse, TickError> {
    let request_error = |source| TickError::Request {
        target: target.to_string(),
        source,
    };
    let mut builder = http::Request::post(target.path.as_str())
        .header(http::header::HOST, target.authority.as_str())
        .header(http::header::CONTENT_LENGTH, BODY.len());
    for (name, value) in event.headers().into_iter().chain(extra.iter().copied()) {
        builder = builder.header(name, value);
    }
    let request = builder
        .body(Full::new(Bytes::from_static(BODY)))
        .map_err(|source| TickError::BuildRequest {
            target: target.to_string(),
            source,
        })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(request_error)?;
    // The connection future drives the socket; it ends once the response is read and the sender dropped.
    let conn = tokio::spawn(conn);
    let response = sender.send_request(request).await.map_err(request_error)?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(request_error)?
        .to_bytes();
    drop(sender);
    conn.abort();
    Ok(TickResponse { status, body })
}

/// Waits for the listener of `target`, then sends it `event`.
pub async fn wait_and_send(
    target: &Target,
    wait: Duration,
    event: &ScheduleEvent,
) -> Result<TickResponse, TickError> {
    let stream = wait_for_listener(target, wait).await?;
    send(stream, target, event).await
}
