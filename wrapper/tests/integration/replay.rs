//! Replay capture in every mode: 500s, timeouts and crashes as JSON lines with redaction and
//! truncation, rotation, an unwritable file; and the access line of exec and persistent mode.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use crate::support::observed::{access_lines, replay_lines, start_proxy};
use crate::support::{env, fixtures, Body, Conn, RespExt, Wrapper};

const SECRET_HEADERS: [(&str, &str); 3] = [
    ("Authorization", "Bearer s3cret"),
    ("Cookie", "session=s3cret"),
    ("Proxy-Authorization", "Basic s3cret"),
];

fn replay_vars(file: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("RUNR_REPLAY", "1".to_string()),
        ("RUNR_TRACING", "1".to_string()),
        ("RUNR_REPLAY_FILE", file.to_string_lossy().into_owned()),
        ("RUNR_REPLAY_MAX_BODY", "8".to_string()),
        ("RUNR_TIMEOUT", "5s".to_string()),
    ]
}

fn assert_redacted(capture: &serde_json::Value) {
    let text = capture.to_string();
    assert!(!text.contains("s3cret"), "{text}");
    for name in ["authorization", "cookie", "proxy-authorization"] {
        assert_eq!(capture["headers"][name], "[redacted]", "{text}");
    }
}

#[test]
fn proxy_captures_500s_timeouts_and_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("replay.jsonl");
    let w = start_proxy(&replay_vars(&file));
    let mut conn = Conn::open(w.addr());
    let mut headers = SECRET_HEADERS.to_vec();
    headers.push(("X-Trace-Me", "yes"));
    let r = conn.send(
        "POST",
        "/status?code=500",
        &headers,
        Body::Sized(b"0123456789abcdef"),
    );
    assert_eq!(r.status, 500);
    assert_eq!(
        conn.send("GET", "/headers", &[], Body::None).status,
        200,
        "not captured"
    );
    let r = Conn::open(w.addr()).send("GET", "/sleep?s=60", &[], Body::None);
    assert_eq!(r.status, 504);
    assert_eq!(r.error(), "handler timed out after 5s");
    // The program breaks off its answer: the client sees a short body and a closed connection.
    let mut s = TcpStream::connect(w.addr()).unwrap();
    s.write_all(b"GET /crash HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);

    let lines = replay_lines(&file, 3);
    assert_eq!(lines.len(), 3, "{lines:?}");
    let access = access_lines(&w.log());
    let by_path = |p: &str| {
        lines
            .iter()
            .find(|l| l["path"] == p)
            .unwrap_or_else(|| panic!("{p} in {lines:?}"))
    };

    let status = by_path("/status");
    assert_eq!(status["failure"], "status");
    assert_eq!(status["status"], 500);
    assert_eq!(status["method"], "POST");
    assert_eq!(status["query"], "code=500");
    assert_eq!(status["body"], "01234567");
    assert_eq!(status["bodyTruncated"], true);
    assert_eq!(status["bodySize"], 16);
    assert_eq!(status["headers"]["x-trace-me"], "yes");
    assert!(status["durationMs"].as_f64().unwrap() > 0.0);
    assert!(status["time"].as_str().unwrap().ends_with('Z'));
    let line = access.iter().find(|a| a.path == "/status").unwrap();
    assert_eq!(status["traceId"], line.trace_id.as_str());
    assert_redacted(status);

    let timeout = by_path("/sleep");
    assert_eq!(timeout["failure"], "timeout");
    assert_eq!(timeout["status"], 504);
    assert_eq!(timeout["bodyTruncated"], false);

    let crash = by_path("/crash");
    assert_eq!(crash["failure"], "crash");
}

#[test]
fn exec_mode_captures_crashes_and_timeouts_and_logs_access_lines() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("replay.jsonl");
    let mut vars = env(
        "exec",
        &[
            "sh",
            "-c",
            r#"cat >/dev/null; case "$RUNR_PATH" in /fail) exit 3;; /slow) exec sleep 60;; *) echo ok;; esac"#,
        ],
    );
    vars.extend(
        replay_vars(&file)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v)),
    );
    let w = Wrapper::start(&vars);
    assert_eq!(w.get("/ok").status, 200);
    let r = w.send(
        "POST",
        "/fail?a=b",
        &SECRET_HEADERS,
        "é0123456789".as_bytes(),
    );
    assert_eq!(r.status, 500);
    assert_eq!(w.get("/slow").status, 504);
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    assert_eq!(
        w.send("GET", "/ok", &[("traceparent", tp)], b"").status,
        200
    );

    let lines = replay_lines(&file, 2);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let fail = &lines[0];
    assert_eq!(
        (
            fail["path"].as_str(),
            fail["failure"].as_str(),
            fail["status"].as_i64()
        ),
        (Some("/fail"), Some("crash"), Some(500))
    );
    assert_eq!(fail["query"], "a=b");
    assert_eq!(fail["bodySize"], 12);
    assert_eq!(fail["bodyTruncated"], true);
    assert_redacted(fail);
    assert!(
        fail["headers"].get("traceparent").is_none(),
        "the client's headers, not the handler's: {fail}"
    );
    assert_eq!(
        (lines[1]["path"].as_str(), lines[1]["failure"].as_str()),
        (Some("/slow"), Some("timeout"))
    );

    w.wait_log("GET /ok 200");
    let access = access_lines(&w.log());
    assert_eq!(access.len(), 4, "{}", w.log());
    assert!(access[0].cold_start && !access[1].cold_start);
    assert_eq!(
        (
            access[1].method.as_str(),
            access[1].path.as_str(),
            access[1].status
        ),
        ("POST", "/fail", 500)
    );
    assert_eq!(access[3].trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(fail["traceId"], access[1].trace_id.as_str());
}

#[test]
fn persistent_mode_captures_a_worker_crash() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("replay.jsonl");
    let mut vars = env(
        "persistent",
        &["python3", "-u", &fixtures().path("worker.py")],
    );
    vars.push(("RUNR_REPLAY".into(), "1".into()));
    vars.push((
        "RUNR_REPLAY_FILE".into(),
        file.to_string_lossy().into_owned(),
    ));
    let w = Wrapper::start(&vars);
    assert_eq!(w.post("/exit", b"bye").status, 502);
    let lines = replay_lines(&file, 1);
    assert_eq!(lines[0]["failure"], "crash");
    assert_eq!(lines[0]["status"], 502);
    assert_eq!(lines[0]["body"], "bye");
    assert!(
        lines[0].get("traceId").is_none(),
        "no trace id without tracing"
    );
    assert!(
        access_lines(&w.log()).is_empty(),
        "no access line without tracing"
    );
}

#[test]
fn capture_file_rotates_keeping_one_previous() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("replay.jsonl");
    let mut vars = replay_vars(&file);
    vars.push(("RUNR_REPLAY_MAX_BYTES", "1000".into()));
    let w = start_proxy(&vars);
    let mut conn = Conn::open(w.addr());
    for _ in 0..8 {
        assert_eq!(
            conn.send("GET", "/status?code=502", &[], Body::None).status,
            502
        );
    }
    let rotated = dir.path().join("replay.jsonl.1");
    runr_testkit::wait_for("the rotated file", Duration::from_secs(30), || {
        rotated.exists().then_some(())
    });
    let current = replay_lines(&file, 1);
    let previous = replay_lines(&rotated, 1);
    assert!(std::fs::metadata(&file).unwrap().len() <= 1000);
    assert!(std::fs::metadata(&rotated).unwrap().len() <= 1000);
    // Eight captures, at most one previous file kept: some were rotated away.
    assert!(current.len() + previous.len() <= 8);
}

#[test]
fn an_unwritable_capture_file_is_a_warning_not_a_failed_request() {
    let mut vars = replay_vars(Path::new("/nonexistent-dir/replay.jsonl"));
    vars.retain(|(k, _)| *k != "RUNR_TIMEOUT");
    let w = start_proxy(&vars);
    let r = Conn::open(w.addr()).send("GET", "/status?code=500", &[], Body::None);
    assert_eq!(r.status, 500);
    assert_eq!(r.text(), "status 500", "the program's own answer");
    w.wait_log("cannot write replay capture");
    assert_eq!(
        Conn::open(w.addr())
            .send("GET", "/pid", &[], Body::None)
            .status,
        200
    );
}

#[test]
fn exec_handler_sees_the_wrapper_span_as_parent() {
    let w = Wrapper::start(&{
        let mut v = env(
            "exec",
            &[
                "sh",
                "-c",
                r#"cat >/dev/null; printf '%s' "$RUNR_HEADER_TRACEPARENT""#,
            ],
        );
        v.push(("RUNR_TRACING".into(), "1".into()));
        v
    });
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let seen = w.send("GET", "/t", &[("traceparent", tp)], b"").text();
    w.wait_log("GET /t 200");
    let line = &access_lines(&w.log())[0];
    assert_eq!(line.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(seen, format!("00-{}-{}-01", line.trace_id, line.span_id));
}

#[test]
fn persistent_mode_exports_its_spans() {
    let collector = crate::support::observed::Collector::start();
    let mut vars = env(
        "persistent",
        &["python3", "-u", &fixtures().path("worker.py")],
    );
    vars.push(("RUNR_TRACING".into(), "1".into()));
    vars.push((
        "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
        format!("http://127.0.0.1:{}", collector.port),
    ));
    vars.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()));
    vars.push(("K_SERVICE".into(), "knative-name".into()));
    let w = Wrapper::start(&vars);
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    assert_eq!(
        w.send("POST", "/orders", &[("traceparent", tp)], b"{}")
            .status,
        200
    );
    let (_, _, doc, spans) = collector.next_spans();
    let resource = &doc["resourceSpans"][0]["resource"]["attributes"];
    assert_eq!(
        crate::support::observed::attr(resource, "service.name")["stringValue"],
        "knative-name"
    );
    let line = &access_lines(&w.log())[0];
    assert_eq!(spans[0]["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(spans[0]["parentSpanId"], "00f067aa0ba902b7");
    assert_eq!(spans[0]["spanId"], line.span_id.as_str());
    assert_eq!(spans[0]["status"]["code"], 0);
}
