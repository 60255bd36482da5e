//! The lingering close: a handler (or a refusal) that answers before the request body has been
//! read still gets its answer to the client, whatever the client does while it sends. The
//! clients are the ones people use: Python's `http.client` and curl (both send the whole body
//! before they read), and a raw socket that writes everything before it reads. 16 of each at
//! once POST 9 MiB (the handler exits at once without reading stdin: `/write-then-exit`) and
//! 100 MiB (over the request limit: 413 before a byte of the body is read); every answer is
//! checked byte for byte, and the wrapper's memory stays flat (nothing is held while the rest
//! of the bodies is read and thrown away).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use runr_testkit::http::{request_head, Body};
use runr_testkit::MIB;

use crate::support::{env, fixtures, pattern, status_kib, Conn, Wrapper};

/// Clients of each kind at once.
const CLIENTS: usize = 16;
/// Under the request limit: streamed into a handler that does not read it.
const SMALL: usize = 9 * MIB;
/// Over it: refused with 413 before it is read.
const LARGE: usize = 100 * MIB;
/// What `/write-then-exit/ANSWER` answers.
const ANSWER: usize = 4096;
/// What the wrapper's RSS may grow by over a whole run (buffers the allocator keeps).
const RSS_MARGIN_KIB: u64 = 64 * 1024;

fn expected_answer() -> Vec<u8> {
    (0..ANSWER as u32).map(pattern).collect()
}

fn path() -> String {
    format!("/write-then-exit/{ANSWER}")
}

fn start(extra: &[(&str, &str)]) -> Wrapper {
    let mut v = env("exec", &[&fixtures().path("stress_handler")]);
    v.push(("RUNR_INPUT".into(), "raw".into()));
    v.push(("RUNR_LOG".into(), "info".into()));
    v.push(("RUNR_TIMEOUT".into(), "300".into()));
    v.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let w = Wrapper::start(&v);
    // One answer first, so the RSS measured before is the serving one.
    let r = w.post(&path(), b"warm-up");
    assert_eq!(r.status, 200, "{}", r.text());
    w
}

/// Checks one client's answer: 200 with the handler's bytes for the small body, the 413
/// document for the large one.
fn check(size: usize, status: u16, body: &[u8], who: &str) {
    if size == SMALL {
        assert_eq!(status, 200, "{who}: {}", String::from_utf8_lossy(body));
        assert!(body == expected_answer(), "{who}: the answer differs");
    } else {
        assert_eq!(status, 413, "{who}: {}", String::from_utf8_lossy(body));
        assert_eq!(
            body, br#"{"error":"request body exceeds 10 MiB"}"#,
            "{who}: the answer differs"
        );
    }
}

/// Runs `round` for both sizes and checks the wrapper's RSS did not grow past the margin.
fn flat_rss(w: &Wrapper, mut round: impl FnMut(usize)) {
    let before = status_kib(w.pid(), "VmRSS");
    for size in [SMALL, LARGE] {
        round(size);
    }
    let after = status_kib(w.pid(), "VmRSS");
    eprintln!("wrapper RSS {before} KiB before, {after} KiB after");
    assert!(
        after <= before + RSS_MARGIN_KIB,
        "the wrapper's RSS grew from {before} KiB to {after} KiB"
    );
}

/// A client writes its whole request (head and body) before it reads a byte, then sends a
/// second request on the same connection: the body was read to its end, so the connection
/// stays open.
#[test]
fn raw_clients_that_write_everything_first_get_their_answers() {
    let w = start(&[]);
    let bodies: Arc<[Vec<u8>; 2]> = Arc::new([vec![b'r'; SMALL], vec![b'R'; LARGE]]);
    flat_rss(&w, |size| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let (addr, bodies) = (w.addr(), bodies.clone());
                std::thread::spawn(move || {
                    let body = &bodies[usize::from(size == LARGE)];
                    let mut c = Conn::open(addr);
                    let head = request_head("POST", &path(), &[], &Body::Sized(body));
                    c.stream().write_all(head.as_bytes()).unwrap();
                    c.stream()
                        .write_all(body)
                        .unwrap_or_else(|e| panic!("raw client {i}: sending the body: {e}"));
                    let r = c.read_response();
                    check(size, r.status, &r.body, &format!("raw client {i}"));
                    // Kept alive: the next request on it is answered.
                    let again = c.send("POST", &path(), &[], Body::Sized(b"again"));
                    check(
                        SMALL,
                        again.status,
                        &again.body,
                        &format!("raw client {i}, again"),
                    );
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
    });
}

/// Python's `http.client`: `request()` sends the whole body, then `getresponse()` reads.
const PY_CLIENT: &str = r#"
import base64, http.client, json, sys, threading
port, path, size, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
body = b"p" * size
out = [None] * n
def one(i):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", path, body=body)
        r = c.getresponse()
        out[i] = {"status": r.status, "body": base64.b64encode(r.read()).decode()}
    except Exception as e:
        out[i] = {"error": repr(e)}
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(out))
"#;

/// `n` Python clients at once POST `size` bytes to `path`: (status, body) each.
fn python_posts(port: u16, path: &str, size: usize, n: usize) -> Vec<(u16, Vec<u8>)> {
    let out = Command::new("python3")
        .args(["-c", PY_CLIENT, &port.to_string(), path, &size.to_string()])
        .arg(n.to_string())
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "python3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answers.len(), n);
    answers
        .iter()
        .enumerate()
        .map(|(i, a)| {
            assert!(a.get("error").is_none(), "python client {i} to {path}: {a}");
            let body = base64_decode(a["body"].as_str().unwrap());
            (a["status"].as_u64().unwrap() as u16, body)
        })
        .collect()
}

#[test]
fn python_http_client_gets_its_answers() {
    let w = start(&[]);
    let port = w.addr().port();
    flat_rss(&w, |size| {
        for (i, (status, body)) in python_posts(port, &path(), size, CLIENTS)
            .iter()
            .enumerate()
        {
            let who = format!("python client {i} ({} MiB)", size / MIB);
            check(size, *status, body, &who);
        }
    });
}

/// The modes that read the whole body before the handler runs answer early only when they
/// refuse; the observed proxy when its program answers without reading the upload.
#[test]
fn refusals_and_programs_that_answer_early_reach_the_client_in_every_mode() {
    for (mode, command) in [
        ("exec", vec![fixtures().path("stress_handler")]),
        (
            "persistent",
            vec!["python3".into(), fixtures().path("worker.py")],
        ),
    ] {
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        let mut v = env(mode, &command);
        v.push(("RUNR_LOG".into(), "info".into()));
        let w = Wrapper::start(&v);
        for (i, (status, body)) in python_posts(w.addr().port(), "/x", LARGE, 4)
            .iter()
            .enumerate()
        {
            check(
                LARGE,
                *status,
                body,
                &format!("{mode} mode, python client {i}"),
            );
        }
    }
    let proxy = crate::support::observed::start_proxy(&[("RUNR_TRACING", "1".to_string())]);
    proxy.get_when_up("/pid");
    for (i, (status, body)) in python_posts(proxy.addr().port(), "/refuse", SMALL, CLIENTS)
        .iter()
        .enumerate()
    {
        assert_eq!(
            (*status, &body[..]),
            (413, &b"refused"[..]),
            "observed proxy, python client {i}"
        );
    }
}

#[test]
fn curl_gets_its_answers_and_exits_0() {
    let w = start(&[]);
    let dir = tempfile::tempdir().unwrap();
    flat_rss(&w, |size| {
        let file = dir.path().join(format!("body-{size}"));
        std::fs::write(&file, vec![b'c'; size]).unwrap();
        let url = format!("http://{}{}", w.addr(), path());
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let out = dir.path().join(format!("answer-{size}-{i}"));
                let child = Command::new("curl")
                    .args(["-sS", "--max-time", "120", "-o"])
                    .arg(&out)
                    .args(["-w", "%{http_code}", "--data-binary"])
                    .arg(format!("@{}", file.display()))
                    .arg(&url)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("run curl");
                (i, out, child)
            })
            .collect();
        for (i, out, child) in clients {
            let done = child.wait_with_output().unwrap();
            let who = format!("curl {i} ({} MiB)", size / MIB);
            assert!(
                done.status.success(),
                "{who}: {:?} {}",
                done.status,
                String::from_utf8_lossy(&done.stderr)
            );
            let status: u16 = String::from_utf8_lossy(&done.stdout).parse().unwrap();
            check(size, status, &std::fs::read(&out).unwrap(), &who);
        }
    });
}

/// A client that keeps sending past the byte bound gets its answer, then the close: it reads
/// the 413 while it still sends, and its sending ends with an error once the wrapper stops
/// reading, long before the gigabyte it announced.
#[test]
fn a_client_sending_past_the_bound_gets_the_answer_then_a_close() {
    let w = start(&[]);
    let announced: u64 = 1 << 30;
    let mut s = TcpStream::connect(w.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: {announced}\r\n\r\n",
        path()
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut w_half = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'x'; MIB];
        let mut sent = 0u64;
        while sent < announced {
            if w_half.write_all(&chunk).is_err() {
                return (sent, true);
            }
            sent += chunk.len() as u64;
        }
        (sent, false)
    });
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(e) => panic!("reading: {e} after {} bytes", answer.len()),
        }
    };
    let (sent, cut) = writer.join().unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 413 "), "{text}");
    assert!(
        text.ends_with(r#"{"error":"request body exceeds 10 MiB"}"#),
        "the whole answer: {text}"
    );
    assert!(closed, "the connection closes after the answer");
    assert!(
        cut,
        "the wrapper stops reading at its bound ({sent} bytes sent)"
    );
    // 128 MiB read and thrown away, then the socket buffers' worth.
    assert!(
        sent >= 128 * MIB as u64 && sent < announced / 2,
        "{sent} bytes were sent before the close"
    );
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}
