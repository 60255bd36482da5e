//! The accept loop with a drain that every HTTP server of the data plane shares (the wrapper's
//! server and observed proxy, the receiver's API): one HTTP/1 connection task per client; once
//! the shutdown future completes, stop accepting and give in-flight requests a time limit
//! (hyper-util's `server_graceful` example, with linkerd's bounded drain).

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};

/// How the drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Every connection finished its request within the limit.
    Done,
    /// Some were still running at the limit (they are dropped with the runtime).
    TimedOut,
}

/// Serves `listener` with `http` until `shutdown` completes, then drains for up to
/// `drain_limit`. `make_service` gets each accepted stream (to set socket options) and its
/// peer's address, and returns the connection's service. Accepted streams get `TCP_NODELAY`:
/// answers are small single writes that Nagle's algorithm would hold back.
pub async fn serve_connections<S, B>(
    listener: TcpListener,
    http: http1::Builder,
    shutdown: impl Future<Output = ()>,
    drain_limit: Duration,
    mut make_service: impl FnMut(&TcpStream, SocketAddr) -> S,
) -> Drained
where
    S: hyper::service::HttpService<Incoming, ResBody = B> + Send + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let service = make_service(&stream, peer);
                    let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                    tokio::spawn(async move {
                        // Client resets and half-sent requests are the client's business.
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning on accept.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!(
        connections = graceful.count(),
        "shutting down: stopped accepting, draining in-flight requests"
    );
    tokio::select! {
        () = graceful.shutdown() => {
            tracing::info!("drained");
            Drained::Done
        }
        () = tokio::time::sleep(drain_limit) => {
            tracing::warn!(limit = %crate::env::display_duration(drain_limit), "drain did not finish in time");
            Drained::TimedOut
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Empty;
    use hyper::body::Bytes;
    use hyper::service::service_fn;
    use hyper::{Request, Response};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    /// A server whose one route answers after `work`, draining for at most `drain_limit`; a
    /// client already sent a request when this returns. Send on the sender to stop it.
    async fn serving_one_request(
        work: Duration,
        drain_limit: Duration,
    ) -> (
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<Drained>,
        tokio::task::JoinHandle<String>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (started_tx, mut started_rx) = tokio::sync::mpsc::channel::<()>(4);
        let server = tokio::spawn(serve_connections(
            listener,
            http1::Builder::new(),
            async move {
                let _ = stop_rx.await;
            },
            drain_limit,
            move |_stream, _peer| {
                let started = started_tx.clone();
                service_fn(move |_req: Request<Incoming>| {
                    let started = started.clone();
                    async move {
                        let _ = started.send(()).await;
                        tokio::time::sleep(work).await;
                        Ok::<_, std::convert::Infallible>(Response::new(Empty::<Bytes>::new()))
                    }
                })
            },
        ));
        let client = tokio::spawn(get(addr));
        started_rx.recv().await.unwrap();
        (addr, stop_tx, server, client)
    }

    #[tokio::test]
    async fn drains_in_flight_requests_then_stops() {
        let (addr, stop, server, client) =
            serving_one_request(Duration::from_millis(200), Duration::from_secs(10)).await;
        stop.send(()).unwrap();
        assert_eq!(server.await.unwrap(), Drained::Done);
        let answer = client.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the listener is closed after the drain"
        );
    }

    #[tokio::test]
    async fn a_request_longer_than_the_limit_is_cut() {
        let (_addr, stop, server, _client) =
            serving_one_request(Duration::from_secs(600), Duration::from_millis(100)).await;
        stop.send(()).unwrap();
        assert_eq!(server.await.unwrap(), Drained::TimedOut);
    }
}
