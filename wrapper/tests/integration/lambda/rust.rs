//! The Rust function on the lambda_runtime and lambda_http crates from crates.io
//! (tests/fixtures/lambda-rust, built once per run): what lambda_http makes of the event, the
//! result's status, headers and cookies, a function error, a streamed response whose chunks
//! reach the client while the function is still writing, and many clients over four runtimes.

use serde_json::json;

use super::bodies;
use super::support::{rust_command, Function, Stream};
use crate::support::{Body, Conn, RespExt};

fn rust(handler: &str, vars: &[(&str, &str)]) -> Function {
    let command = rust_command();
    let mut all = vec![
        ("RUNR_COMMAND", command.as_str()),
        ("RUNR_HANDLER", handler),
    ];
    all.extend_from_slice(vars);
    Function::start(&[], &all)
}

#[test]
fn lambda_http_reads_the_event_and_its_response_maps_back() {
    let f = rust("http", &[]);
    let r = f.send(
        "POST",
        "/r/p?name=Run%20R&x=1&x=2&status=202&set=k%3Dv",
        &[
            ("Cookie", "a=1; b=2"),
            ("X-Custom", "yes"),
            ("Content-Type", "text/plain"),
        ],
        b"body text",
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-handler"), Some("lambda_http"));
    assert_eq!(r.headers_named("set-cookie"), ["k=v", "second=2"]);
    let seen = r.json();
    assert_eq!(seen["method"], "POST");
    assert_eq!(seen["path"], "/r/p");
    assert_eq!(seen["query"], "name=Run%20R&x=1&x=2&status=202&set=k%3Dv");
    assert_eq!(seen["name"], "Run R");
    assert_eq!(seen["repeated"], json!(["1", "2"]));
    assert_eq!(seen["body"], "body text");
    assert_eq!(seen["headers"]["x-custom"], "yes");
    assert_eq!(
        seen["headers"]["cookie"], "a=1;b=2",
        "lambda_http joins `cookies` back"
    );
    // Binary arrives as bytes.
    let r = f.post("/bin", &[0xff, 0x00, 0xfe]);
    assert_eq!(r.json()["body"], json!([255, 0, 254]));
}

#[test]
fn a_rust_function_error_is_502() {
    let f = rust("fail", &[]);
    let r = f.get("/");
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.error(), "the rust function failed on purpose");
    assert!(!r.json()["errorType"].as_str().unwrap().is_empty());
    // And again: the runtime lives on.
    assert_eq!(f.get("/").status, 502);
    assert_eq!(f.log().matches("runtime started").count(), 1);
}

/// The function waits for `<go>/<i>` before writing chunk `i`; the test creates it only after
/// reading chunk `i - 1`, so each chunk provably reached the client before the next existed.
#[test]
fn a_streamed_response_reaches_the_client_as_it_is_written() {
    let f = rust("stream", &[]);
    let go = tempfile::tempdir().unwrap();
    let mut s = Stream::get(
        f.addr(),
        &format!("/stream?chunks=3&go={}", go.path().display()),
    );
    assert_eq!(s.status, 201);
    assert_eq!(s.header("content-type"), ["text/plain"]);
    assert_eq!(s.header("x-streamed"), ["yes"]);
    assert_eq!(s.header("transfer-encoding"), ["chunked"]);
    assert_eq!(s.header("access-control-allow-origin"), ["*"]);
    for i in 0..3 {
        if i > 0 {
            std::fs::write(go.path().join(i.to_string()), b"").unwrap();
        }
        let want = format!("chunk {i}\n");
        assert_eq!(s.read_exact(want.len()), want.as_bytes());
    }
    assert_eq!(s.chunk(), Ok(None), "the stream ends with its last chunk");
    // The runtime is ready for the next invocation.
    let r = f.get(&format!("/stream?chunks=1&go={}", go.path().display()));
    assert_eq!((r.status, r.text().as_str()), (201, "chunk 0\n"));
}

#[test]
fn many_concurrent_streams_over_four_runtimes_every_answer_exact() {
    let f = rust("stream", &[("RUNR_WORKERS", "4")]);
    f.wait_runtimes(4);
    let addr = f.addr();
    let handles: Vec<_> = (0..16)
        .map(|t| {
            std::thread::spawn(move || {
                for round in 0..3 {
                    let n = 20 + t * 3 + round;
                    let mut s = Stream::get(addr, &format!("/stream?chunks={n}"));
                    assert_eq!(s.status, 201);
                    assert_eq!(s.header("content-type"), ["text/plain"]);
                    assert_eq!(s.header("x-streamed"), ["yes"]);
                    let mut body = Vec::new();
                    while let Some(chunk) = s.chunk().unwrap() {
                        body.extend_from_slice(&chunk);
                    }
                    let want: String = (0..n).map(|i| format!("chunk {i}\n")).collect();
                    assert_eq!(String::from_utf8(body).unwrap(), want);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn many_clients_over_four_runtimes_every_answer_exact() {
    let f = rust("echo", &[("RUNR_WORKERS", "4")]);
    f.wait_runtimes(4);
    let addr = f.addr();
    let handles: Vec<_> = (0..32)
        .map(|t| {
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                let bodies = bodies();
                for i in 0..12 {
                    // Text bodies only: the echo function answers its body as text.
                    let body = &bodies[((t + i) % 5) * 2];
                    let r = conn.send("POST", "/echo", &[], Body::Sized(body));
                    assert_eq!(r.status, 200, "{}", r.text());
                    assert_eq!(r.header("content-type"), Some("text/plain"));
                    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
                    assert!(r.body == *body, "body of {} bytes differs", body.len());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
