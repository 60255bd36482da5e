//! The fixtures' HTTP server: exact answers under many concurrent keep-alive clients, every
//! bound reached, stop and restart.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runr_testkit::http::{self, Body, Conn};
use runr_testkit::httpd::{error_body, HttpServer, Limits, Request, Response};
use runr_testkit::wait_for;

/// Answers with what it read, so the client can check every byte.
fn echo(req: &Request) -> Response {
    if req.path() == "/panic" {
        panic!("on purpose");
    }
    if req.path() == "/stream" {
        let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let short = req.query().iter().any(|(k, _)| k == "short");
        let len = body.len() as u64;
        return Response::stream(
            200,
            len,
            Box::new(move |w| w.write_all(if short { &body[..10] } else { &body })),
        );
    }
    let text = format!(
        "{} {} q={:?} x={:?} body={}",
        req.method,
        req.path(),
        req.query(),
        req.header("x-test"),
        String::from_utf8_lossy(&req.body)
    );
    Response::new(201)
        .with_header("X-Echo", "1")
        .with_body(text)
}

fn expect(r: &http::Resp, status: u16, headers: &[(&str, &str)], body: &str) {
    let want: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(
        (r.status, &r.headers, r.text().as_str()),
        (status, &want, body)
    );
}

#[test]
fn concurrent_keep_alive_clients_get_exact_answers() {
    let server = Arc::new(HttpServer::start(echo));
    const CLIENTS: usize = 32;
    const ROUNDS: usize = 25;
    let workers: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let server = Arc::clone(&server);
            std::thread::spawn(move || {
                let mut conn = Conn::open(server.addr());
                for r in 0..ROUNDS {
                    let payload = format!("client {c} round {r} {}", "p".repeat(r * 97));
                    let tag = format!("t{c}-{r}");
                    let (method, target, body, want) = match r % 3 {
                        0 => (
                            "GET",
                            format!("/a/b?k=v%20{c}&k={r}&e=%3D"),
                            Body::None,
                            format!(
                                "GET /a/b q=[(\"k\", \"v {c}\"), (\"k\", \"{r}\"), (\"e\", \"=\")] x=Some({tag:?}) body="
                            ),
                        ),
                        1 => (
                            "POST",
                            "/post".to_string(),
                            Body::Sized(payload.as_bytes()),
                            format!("POST /post q=[] x=Some({tag:?}) body={payload}"),
                        ),
                        _ => (
                            "PUT",
                            "/chunked".to_string(),
                            Body::Chunked(payload.as_bytes()),
                            format!("PUT /chunked q=[] x=Some({tag:?}) body={payload}"),
                        ),
                    };
                    let resp = conn.send(method, &target, &[("X-Test", &tag)], body);
                    let len = want.len().to_string();
                    expect(
                        &resp,
                        201,
                        &[("X-Echo", "1"), ("Content-Length", &len)],
                        &want,
                    );
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(server.requests(), (CLIENTS * ROUNDS) as u64);
    // Every client closed its connection: the server lets go of all of them.
    wait_for("every connection let go", Duration::from_secs(30), || {
        (server.connections() == 0).then_some(())
    });
}

#[test]
fn requests_past_the_bounds_get_4xx_json_and_a_close() {
    let server = HttpServer::start(echo);
    let json = "application/json; charset=utf-8";
    let refused = |raw: &[u8], status: u16, code: &str, message: &str| {
        let r = http::send_raw(server.addr(), raw);
        let body = error_body(code, message);
        let len = body.len().to_string();
        expect(
            &r,
            status,
            &[
                ("Content-Type", json),
                ("Content-Length", &len),
                ("Connection", "close"),
            ],
            &body,
        );
    };
    let big_header = format!("GET / HTTP/1.1\r\nX-Big: {}\r\n\r\n", "h".repeat(17 * 1024));
    refused(
        big_header.as_bytes(),
        431,
        "HEADERS_TOO_LARGE",
        "request head larger than 16384 bytes",
    );
    // Exactly at the bound is fine.
    let line = "GET / HTTP/1.1\r\n";
    let pad = 16 * 1024 - line.len() - "X-Pad: \r\n\r\n".len();
    let at_bound = format!("{line}X-Pad: {}\r\n\r\n", "p".repeat(pad));
    assert_eq!(at_bound.len(), 16 * 1024);
    assert_eq!(
        http::send_raw(server.addr(), at_bound.as_bytes()).status,
        201
    );

    refused(
        format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            64 * 1024 + 1
        )
        .as_bytes(),
        413,
        "TOO_LARGE",
        "request body larger than 65536 bytes",
    );
    let chunk = "a".repeat(40_000);
    refused(
        format!(
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
            chunk.len(),
            chunk.len()
        )
        .as_bytes(),
        413,
        "TOO_LARGE",
        "request body larger than 65536 bytes",
    );
    let max_body = "b".repeat(64 * 1024);
    let r = http::request(
        server.addr(),
        "POST",
        "/",
        &[],
        Body::Sized(max_body.as_bytes()),
    );
    assert_eq!(r.status, 201);
    refused(
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        400,
        "BAD_REQUEST",
        "unsupported Transfer-Encoding \"gzip\"",
    );
    refused(
        b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        400,
        "BAD_REQUEST",
        "conflicting Content-Length headers",
    );
    refused(
        b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        400,
        "BAD_REQUEST",
        "bad Content-Length \"x\"",
    );
    refused(
        b"GET /\r\n\r\n",
        400,
        "BAD_REQUEST",
        "bad request line \"GET /\"",
    );
    refused(
        b"GET / HTTP/2.0\r\n\r\n",
        400,
        "BAD_REQUEST",
        "bad request line \"GET / HTTP/2.0\"",
    );
    refused(
        b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
        400,
        "BAD_REQUEST",
        "bad header line \"no colon\"",
    );
    refused(
        b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
        400,
        "BAD_REQUEST",
        "bad header line \"Bad Name: x\"",
    );
    // A panicking handler: 500, and the server goes on.
    let r = http::get(server.addr(), "/panic");
    assert_eq!(r.status, 500);
    assert_eq!(r.text(), error_body("UNKNOWN", "the test fixture panicked"));
    assert_eq!(http::get(server.addr(), "/ok").status, 201);
}

#[test]
fn the_connection_limit_is_reached_and_recovers() {
    let limits = Limits {
        max_connections: 3,
        ..Limits::default()
    };
    let server = HttpServer::start_with(limits, echo);
    // Three connections that stay open (each served once, so each is counted).
    let mut held: Vec<Conn> = (0..3)
        .map(|_| {
            let mut c = Conn::open(server.addr());
            assert_eq!(c.send("GET", "/", &[], Body::None).status, 201);
            c
        })
        .collect();
    assert_eq!(server.connections(), 3);
    let body = error_body("UNAVAILABLE", "too many connections (at most 3 at once)");
    let len = body.len().to_string();
    for _ in 0..2 {
        let r = http::get(server.addr(), "/");
        expect(
            &r,
            503,
            &[
                ("Content-Type", "application/json; charset=utf-8"),
                ("Content-Length", &len),
                ("Connection", "close"),
            ],
            &body,
        );
    }
    held.pop();
    wait_for("a connection to be let go", Duration::from_secs(30), || {
        (server.connections() == 2).then_some(())
    });
    assert_eq!(http::get(server.addr(), "/").status, 201);
    // The ones still held still work.
    assert_eq!(held[0].send("GET", "/", &[], Body::None).status, 201);
}

/// Connections over the limit are answered from a bounded number of threads; past that bound
/// they are closed unanswered.
#[test]
fn refusals_are_bounded_too() {
    let limits = Limits {
        max_connections: 1,
        max_rejecting: 2,
        reject_wait: Duration::from_secs(60),
        ..Limits::default()
    };
    let server = HttpServer::start_with(limits, echo);
    let mut held = Conn::open(server.addr());
    assert_eq!(held.send("GET", "/", &[], Body::None).status, 201);
    // Two over the limit that have not sent their heads: each holds a refusal thread.
    let mut waiting: Vec<Conn> = (0..2).map(|_| Conn::open(server.addr())).collect();
    wait_for("two refusals in progress", Duration::from_secs(30), || {
        (server.rejecting() == 2).then_some(())
    });
    let mut third = TcpStream::connect(server.addr()).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(third.read(&mut buf).unwrap(), 0, "closed without an answer");
    let body = error_body("UNAVAILABLE", "too many connections (at most 1 at once)");
    for c in &mut waiting {
        let r = c.send("GET", "/", &[], Body::None);
        assert_eq!((r.status, r.text()), (503, body.clone()));
    }
    wait_for("the refusals to finish", Duration::from_secs(30), || {
        (server.rejecting() == 0).then_some(())
    });
    assert_eq!(held.send("GET", "/", &[], Body::None).status, 201);
}

#[test]
fn idle_connections_are_closed() {
    let limits = Limits {
        idle_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = HttpServer::start_with(limits, echo);
    let mut idle = TcpStream::connect(server.addr()).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 1];
    // Closed by the server without an answer.
    assert_eq!(idle.read(&mut buf).unwrap(), 0);
    // Half a request head, then silence: closed as well.
    let mut half = TcpStream::connect(server.addr()).unwrap();
    half.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    half.write_all(b"GET / HTTP/1.1\r\nHost:").unwrap();
    assert_eq!(half.read(&mut buf).unwrap(), 0);
    wait_for("no connections", Duration::from_secs(30), || {
        (server.connections() == 0).then_some(())
    });
}

#[test]
fn connection_close_and_http_1_0() {
    let server = HttpServer::start(echo);
    for raw in [
        &b"GET /x HTTP/1.0\r\n\r\n"[..],
        &b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n"[..],
    ] {
        let mut s = TcpStream::connect(server.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(raw).unwrap();
        let mut all = String::new();
        s.read_to_string(&mut all).unwrap();
        let want_body = "GET /x q=[] x=None body=";
        assert_eq!(
            all,
            format!(
                "HTTP/1.1 201 Created\r\nX-Echo: 1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{want_body}",
                want_body.len()
            )
        );
    }
    // HTTP/1.0 with keep-alive stays open for a second request.
    let mut c = Conn::open(server.addr());
    c.stream()
        .write_all(b"GET /1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        .unwrap();
    assert_eq!(c.read_response().status, 201);
    c.stream()
        .write_all(b"GET /2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        .unwrap();
    assert_eq!(c.read_response().text(), "GET /2 q=[] x=None body=");
}

#[test]
fn streamed_bodies_and_their_length() {
    let server = HttpServer::start(echo);
    let mut c = Conn::open(server.addr());
    let r = c.send("GET", "/stream", &[], Body::None);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("100000"));
    assert!(r
        .body
        .iter()
        .enumerate()
        .all(|(i, b)| *b == (i % 251) as u8));
    assert_eq!(r.body.len(), 100_000);
    // HEAD: the length, no body, and the connection goes on.
    let r = c.send("HEAD", "/stream", &[], Body::None);
    assert_eq!(
        (r.status, r.header("content-length"), r.body.len()),
        (200, Some("100000"), 0)
    );
    assert_eq!(c.send("GET", "/x", &[], Body::None).status, 201);
    // A writer that sends less than it announced: the connection is closed, not reused.
    c.stream()
        .write_all(b"GET /stream?short HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let err = c.try_read_response().unwrap_err();
    assert!(err.contains("body of 100000 bytes"), "{err}");
}

#[test]
fn stop_closes_connections_and_restart_serves_the_same_port() {
    let mut server = HttpServer::start(echo);
    let addr = server.addr();
    let mut open = Conn::open(addr);
    assert_eq!(open.send("GET", "/", &[], Body::None).status, 201);
    server.stop();
    assert!(!server.is_running());
    assert!(runr_testkit::nothing_listens(addr));
    open.stream()
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .ok();
    assert!(open.try_read_response().is_err(), "closed by stop");
    server.restart();
    assert!(server.is_running());
    assert_eq!(server.addr(), addr);
    assert_eq!(http::get(addr, "/again").status, 201);
    assert_eq!(server.requests(), 2);
}

/// A slow handler does not hold up other connections.
#[test]
fn connections_are_served_independently() {
    let release = Arc::new(AtomicBool::new(false));
    let r2 = Arc::clone(&release);
    let server = Arc::new(HttpServer::start(move |req| {
        if req.path() == "/slow" {
            while !r2.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Response::new(204)
    }));
    let s2 = Arc::clone(&server);
    let slow = std::thread::spawn(move || http::get(s2.addr(), "/slow").status);
    wait_for("the slow request to be in", Duration::from_secs(30), || {
        (server.requests() == 1).then_some(())
    });
    let fast = http::get(server.addr(), "/fast");
    assert_eq!((fast.status, fast.header("content-length")), (204, None));
    release.store(true, Ordering::SeqCst);
    assert_eq!(slow.join().unwrap(), 204);
}
