//! The observed proxy of http mode: streaming both ways in bounded memory, keep-alive,
//! traceparent continuation, the access line, OTLP export to a test collector, probes, CORS,
//! the 503 wait, SIGTERM drain and the program's own exit.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use nix::sys::signal::Signal;
use runr_testkit::MIB;
use runr_testkit::{free_port, wait_for};

use crate::support::observed::{access_lines, attr, start_proxy, vm_hwm_kib, Collector};
use crate::support::{alive, Body, Conn, RespExt};

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn tracing_on() -> Vec<(&'static str, String)> {
    vec![("RUNR_TRACING", "1".to_string())]
}

#[test]
fn streams_100_mib_each_way_in_bounded_memory() {
    let w = start_proxy(&tracing_on());
    let total = 100 * MIB;
    let pattern: Vec<u8> = (0..=255u8).cycle().take(MIB).collect();

    // Upload: the program hashes what arrives.
    let mut s = TcpStream::connect(w.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: {total}\r\n\r\n"
    )
    .unwrap();
    let mut hasher_input = 0usize;
    for _ in 0..100 {
        s.write_all(&pattern).unwrap();
        hasher_input += pattern.len();
    }
    assert_eq!(hasher_input, total);
    let mut conn_reader = BufReader::new(s);
    let (status, body) = read_answer(&mut conn_reader);
    assert_eq!(status, 200);
    let got: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(got["bytes"], total);
    let expected = python_sha256_of_pattern(total);
    assert_eq!(got["sha256"], expected);

    // Download on the same connection: the program streams, we count and check every byte.
    let s = conn_reader.get_mut();
    write!(s, "GET /source?n={total} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let (status, len) = read_head(&mut conn_reader);
    assert_eq!(status, 200);
    assert_eq!(len, total);
    let mut seen = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    while seen < total {
        let n = conn_reader
            .read(&mut buf[..(total - seen).min(256 * 1024)])
            .unwrap();
        assert!(n > 0, "connection closed after {seen} bytes");
        for (i, b) in buf[..n].iter().enumerate() {
            assert_eq!(*b, ((seen + i) % 256) as u8);
        }
        seen += n;
    }
    let hwm = vm_hwm_kib(w.child.pid());
    assert!(
        hwm < 40 * 1024,
        "wrapper peak RSS {hwm} KiB: bodies must stream, not buffer"
    );
    assert_eq!(access_lines(&w.log()).len(), 2, "{}", w.log());
}

/// sha256 of the first `n` bytes of the repeating 0..=255 pattern, computed by python (no hash
/// crate in the test's dependencies).
fn python_sha256_of_pattern(n: usize) -> String {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import hashlib\nh=hashlib.sha256()\np=bytes(range(256))*4096\nn={n}\n\
             while n:\n  c=p[:min(n,len(p))]\n  h.update(c)\n  n-=len(c)\nprint(h.hexdigest())"
        ))
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The status and `Content-Length` of the answer `r` holds next, leaving its body in `r`.
fn read_head(r: &mut BufReader<TcpStream>) -> (u16, usize) {
    let head = runr_testkit::http::read_head(r).unwrap();
    (head.status, head.content_length().unwrap_or(0) as usize)
}

fn read_answer(r: &mut BufReader<TcpStream>) -> (u16, Vec<u8>) {
    let (status, len) = read_head(r);
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    (status, body)
}

#[test]
fn keep_alive_holds_on_both_sides() {
    let w = start_proxy(&tracing_on());
    let mut conn = Conn::open(w.addr());
    let a = conn.send("GET", "/pid", &[], Body::None).json();
    let b = conn.send("GET", "/pid", &[], Body::None).json();
    assert_eq!(
        a["client_port"], b["client_port"],
        "one upstream connection for one client connection"
    );
    let other = Conn::open(w.addr())
        .send("GET", "/pid", &[], Body::None)
        .json();
    assert_ne!(other["client_port"], a["client_port"]);
}

#[test]
fn traceparent_is_continued_and_the_access_line_written() {
    let w = start_proxy(&tracing_on());
    let mut conn = Conn::open(w.addr());
    let seen = conn.send("GET", "/headers?x=1", &[("traceparent", TP)], Body::None);
    assert_eq!(seen.status, 200);
    assert_eq!(seen.header("access-control-allow-origin"), Some("*"));
    let upstream_tp = seen.json()["traceparent"].as_str().unwrap().to_string();
    let fresh = conn
        .send("POST", "/headers", &[], Body::Sized(b"{}"))
        .json();
    let fresh_tp = fresh["traceparent"].as_str().unwrap().to_string();

    w.wait_log("POST /headers 200");
    let lines = access_lines(&w.log());
    assert_eq!(lines.len(), 2, "{}", w.log());
    let (first, second) = (&lines[0], &lines[1]);
    assert_eq!(
        first.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736",
        "the incoming trace id"
    );
    assert_eq!(
        (first.method.as_str(), first.path.as_str(), first.status),
        ("GET", "/headers", 200)
    );
    assert!(first.sampled && first.cold_start && !second.cold_start);
    assert!(first.ms > 0.0);
    // The upstream's parent is the wrapper's span, not the caller's.
    assert_eq!(
        upstream_tp,
        format!("00-{}-{}-01", first.trace_id, first.span_id)
    );
    assert_ne!(first.span_id, "00f067aa0ba902b7");
    // Without a traceparent a new trace starts.
    assert_ne!(second.trace_id, first.trace_id);
    assert_eq!(
        fresh_tp,
        format!("00-{}-{}-01", second.trace_id, second.span_id)
    );
}

#[test]
fn sampler_always_off_marks_unsampled() {
    let mut vars = tracing_on();
    vars.push(("OTEL_TRACES_SAMPLER", "always_off".into()));
    let w = start_proxy(&vars);
    let seen = Conn::open(w.addr())
        .send("GET", "/headers", &[("traceparent", TP)], Body::None)
        .json();
    assert!(
        seen["traceparent"].as_str().unwrap().ends_with("-00"),
        "{seen}"
    );
    w.wait_log("GET /headers 200");
    assert!(!access_lines(&w.log())[0].sampled);
}

#[test]
fn spans_are_exported_to_an_otlp_collector() {
    let collector = Collector::start();
    let mut vars = tracing_on();
    vars.push((
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        format!("http://127.0.0.1:{}", collector.port),
    ));
    vars.push(("OTEL_SERVICE_NAME", "orders-test".into()));
    vars.push(("OTEL_BSP_SCHEDULE_DELAY", "100".into()));
    let w = start_proxy(&vars);
    let r = Conn::open(w.addr()).send(
        "GET",
        "/status?code=503",
        &[("traceparent", TP), ("User-Agent", "t/1")],
        Body::None,
    );
    assert_eq!(r.status, 503);
    let (path, ctype, doc, spans) = collector.next_spans();
    assert_eq!(path, "/v1/traces");
    assert_eq!(ctype, "application/json");
    let resource = &doc["resourceSpans"][0]["resource"]["attributes"];
    assert_eq!(attr(resource, "service.name")["stringValue"], "orders-test");
    assert_eq!(spans.len(), 1);
    let span = &spans[0];
    let line = &access_lines(&w.log())[0];
    assert_eq!(span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(span["parentSpanId"], "00f067aa0ba902b7");
    assert_eq!(span["spanId"], line.span_id.as_str());
    assert_eq!(span["kind"], 2);
    assert_eq!(span["name"], "GET");
    assert_eq!(span["status"]["code"], 2, "a 5xx is an error span");
    assert_eq!(
        attr(&span["attributes"], "http.response.status_code")["intValue"],
        "503"
    );
    assert_eq!(
        attr(&span["attributes"], "url.path")["stringValue"],
        "/status"
    );
    assert_eq!(
        attr(&span["attributes"], "user_agent.original")["stringValue"],
        "t/1"
    );
    let start: u128 = span["startTimeUnixNano"].as_str().unwrap().parse().unwrap();
    let end: u128 = span["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
    assert!(end > start);
}

#[test]
fn a_collector_that_is_down_costs_one_warning_and_no_request() {
    let mut vars = tracing_on();
    vars.push((
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        format!("http://127.0.0.1:{}/v1/traces", free_port()),
    ));
    vars.push(("OTEL_BSP_SCHEDULE_DELAY", "50".into()));
    let w = start_proxy(&vars);
    let mut conn = Conn::open(w.addr());
    for _ in 0..5 {
        assert_eq!(conn.send("GET", "/pid", &[], Body::None).status, 200);
    }
    w.wait_log("cannot export spans");
    for _ in 0..5 {
        assert_eq!(conn.send("GET", "/pid", &[], Body::None).status, 200);
    }
    wait_for("10 access lines", Duration::from_secs(30), || {
        (access_lines(&w.log()).len() == 10).then_some(())
    });
    assert_eq!(
        w.log().matches("cannot export spans").count(),
        1,
        "{}",
        w.log()
    );
}

#[test]
fn probes_and_preflights_are_answered_by_the_wrapper() {
    let w = start_proxy(&tracing_on());
    assert_eq!(
        Conn::open(w.addr())
            .send("GET", "/pid", &[], Body::None)
            .status,
        200
    );
    let pre = Conn::open(w.addr()).send(
        "OPTIONS",
        "/anything",
        &[("Origin", "https://a.example")],
        Body::None,
    );
    assert_eq!(pre.status, 204);
    assert_eq!(
        pre.header("access-control-allow-methods"),
        Some("GET, POST, PUT, DELETE, PATCH, OPTIONS")
    );
    assert_eq!(pre.header("access-control-max-age"), Some("86400"));
    let probe = Conn::open(w.addr()).send("GET", "/", &[("K-Network-Probe", "queue")], Body::None);
    assert_eq!((probe.status, probe.text().as_str()), (200, "ok"));
    // Neither is an invocation.
    assert_eq!(access_lines(&w.log()).len(), 1, "{}", w.log());
}

#[test]
fn a_program_that_never_listens_gets_503_after_the_wait() {
    let w = crate::support::observed::Proxy::start(&[
        ("RUNR_WRAPPER_MODE".into(), "http".into()),
        ("RUNR_COMMAND".into(), r#"["sleep", "300"]"#.into()),
        ("RUNR_UPSTREAM_PORT".into(), free_port().to_string()),
        ("RUNR_TRACING".into(), "1".into()),
        ("RUNR_TICK_WAIT".into(), "300ms".into()),
    ]);
    let r = Conn::open(w.addr()).send("GET", "/", &[], Body::None);
    assert_eq!(r.status, 503);
    assert_eq!(r.error(), "the function is not listening yet");
    let probe = Conn::open(w.addr()).send("GET", "/", &[("K-Kubelet-Probe", "1")], Body::None);
    assert_eq!(
        probe.status, 503,
        "not ready while the program does not listen"
    );
    w.wait_log("the program does not listen");
}

#[test]
fn sigterm_drains_then_stops_the_program() {
    let mut w = start_proxy(&tracing_on());
    let upstream_pid = Conn::open(w.addr())
        .send("GET", "/pid", &[], Body::None)
        .json()["pid"]
        .as_i64()
        .unwrap() as i32;
    let addr = w.addr();
    let slow = std::thread::spawn(move || {
        Conn::open(addr)
            .send("GET", "/sleep?s=1", &[], Body::None)
            .status
    });
    // The program's stderr is the wrapper's: the request is in flight once it says so.
    w.wait_log("sleep start");
    w.child.signal(Signal::SIGTERM);
    assert_eq!(slow.join().unwrap(), 200, "in-flight request drained");
    let status = w.child.wait_timeout(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{}", w.log());
    assert!(!alive(upstream_pid), "the program was stopped");
    assert!(w.log().contains("program stopped"), "{}", w.log());
}

#[test]
fn the_program_exiting_ends_the_wrapper_with_its_status() {
    let mut w = start_proxy(&tracing_on());
    let mut s = TcpStream::connect(w.addr()).unwrap();
    s.write_all(b"GET /exit HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let status = w.child.wait_timeout(Duration::from_secs(20));
    assert_eq!(status.code(), Some(3), "{}", w.log());
    assert!(w.log().contains("the program exited"), "{}", w.log());
}

#[test]
fn expect_continue_is_answered_and_the_body_forwarded() {
    let w = start_proxy(&tracing_on());
    let s = TcpStream::connect(w.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = BufReader::new(s);
    r.get_mut()
        .write_all(
            b"POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
        )
        .unwrap();
    let (interim, _) = read_head(&mut r);
    assert_eq!(interim, 100, "the client is told to send its body");
    r.get_mut().write_all(b"hello").unwrap();
    let (status, body) = read_answer(&mut r);
    assert_eq!(status, 200);
    let got: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(got["bytes"], 5);
}

#[test]
fn a_binary_server_that_closes_each_connection_is_proxied_with_client_keep_alive() {
    // busybox httpd answers one request per connection: the proxy reconnects behind a client
    // connection that stays open.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("index.html"), "hello from busybox").unwrap();
    let upstream = free_port();
    let command = serde_json::to_string(&[
        "busybox",
        "httpd",
        "-f",
        "-p",
        &format!("127.0.0.1:{upstream}"),
        "-h",
        &dir.path().to_string_lossy(),
    ])
    .unwrap();
    let w = crate::support::observed::Proxy::start(&[
        ("RUNR_WRAPPER_MODE".into(), "http".into()),
        ("RUNR_COMMAND".into(), command),
        ("RUNR_UPSTREAM_PORT".into(), upstream.to_string()),
        ("RUNR_TRACING".into(), "1".into()),
    ]);
    let mut conn = Conn::open(w.addr());
    for _ in 0..3 {
        let r = conn.send("GET", "/index.html", &[], Body::None);
        assert_eq!(r.status, 200, "{}", w.log());
        assert_eq!(r.text(), "hello from busybox");
    }
    assert_eq!(conn.send("GET", "/missing", &[], Body::None).status, 404);
    w.wait_log("GET /missing 404");
    assert_eq!(access_lines(&w.log()).len(), 4);
}
