//! X-RunR-Error on every answer the wrapper makes instead of the handler (timeout, crash,
//! start, limit; overload and unavailable where the server makes them), never on the
//! handler's own answers, under concurrency too.

use crate::support::{env, fixtures, Body, Conn, RespExt, Wrapper};
use crate::telemetry_support::vars;

/// Exec handler answering by path (`RUNR_PATH`).
const ROUTED: &str = r#"case "$RUNR_PATH" in
  /own500) printf '{"statusCode":500,"headers":{"X-RunR-Error":"overload"},"body":"mine"}' ;;
  /forged) printf '{"statusCode":200,"headers":{"x-runr-error":["timeout","crash"]},"body":"fine"}' ;;
  /fail) exit 3 ;;
  /sleep) sleep 5 ;;
  /big) head -c 11534336 /dev/zero ;;
  *) printf 'ok %s' "$RUNR_PATH" ;;
esac"#;

fn exec_routed() -> Wrapper {
    let mut v = env("exec", &["bash", "-c", ROUTED]);
    // JSON input: the whole body is read before the handler runs (a raw body is streamed in,
    // and a handler that answers without reading it ends the keep-alive connection).
    v.extend(vars(&[("RUNR_TIMEOUT", "1")]));
    Wrapper::start(&v)
}

#[test]
fn exec_mode_classes_and_the_handlers_own_answers() {
    let w = exec_routed();
    let cases: [(&str, u16, Option<&str>, &str); 6] = [
        (
            "/sleep",
            504,
            Some("timeout"),
            r#"{"error":"handler timed out after 1s"}"#,
        ),
        (
            "/fail",
            500,
            Some("crash"),
            r#"{"error":"handler exited with status 3"}"#,
        ),
        (
            "/big",
            502,
            Some("limit"),
            r#"{"error":"handler output exceeds 10 MiB"}"#,
        ),
        ("/own500", 500, None, "mine"),
        ("/forged", 200, None, "fine"),
        ("/x", 200, None, "ok /x"),
    ];
    for (path, status, class, body) in cases {
        let r = w.get(path);
        assert_eq!(
            (r.status, r.header("x-runr-error"), r.text().as_str()),
            (status, class, body),
            "{path}"
        );
        assert!(
            r.headers_named("x-runr-error").len() <= 1,
            "{path}: {:?}",
            r.headers
        );
    }
    let r = w.send("POST", "/", &[("Content-Length", "10485761")], b"");
    assert_eq!(
        (r.status, r.header("x-runr-error"), r.error().as_str()),
        (413, Some("limit"), "request body exceeds 10 MiB")
    );
    // Probes and preflights are the wrapper's own business, not a failed invocation.
    let r = w.send("GET", "/", &[("K-Network-Probe", "activator")], b"");
    assert_eq!((r.status, r.header("x-runr-error")), (200, None));
    let r = w.send("OPTIONS", "/", &[], b"");
    assert_eq!((r.status, r.header("x-runr-error")), (204, None));
}

#[test]
fn exec_mode_classes_under_concurrency_answer_by_answer() {
    let w = exec_routed();
    let addr = w.addr();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                for j in 0..12 {
                    let (path, status, class, body) = match (i + j) % 3 {
                        0 => (format!("/ok{i}-{j}"), 200, None, format!("ok /ok{i}-{j}")),
                        1 => (
                            "/fail".to_string(),
                            500,
                            Some("crash"),
                            r#"{"error":"handler exited with status 3"}"#.to_string(),
                        ),
                        _ => ("/own500".to_string(), 500, None, "mine".to_string()),
                    };
                    let r = c.send("GET", &path, &[], Body::None);
                    assert_eq!(r.status, status, "{path}");
                    assert_eq!(r.header("x-runr-error"), class, "{path}");
                    assert_eq!(r.text(), body, "{path}");
                    let ctype = if class.is_some() {
                        "application/json"
                    } else {
                        "text/plain; charset=utf-8"
                    };
                    assert_eq!(r.header("content-type"), Some(ctype), "{path}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_program_that_cannot_start_is_logged_once_and_answers_start() {
    let mut w = Wrapper::start(&env("exec", &["/nonexistent/handler", "arg"]));
    for _ in 0..3 {
        let r = w.get("/");
        assert_eq!(
            (r.status, r.header("x-runr-error"), r.error().as_str()),
            (500, Some("start"), "handler failed to start")
        );
    }
    let log = w.log();
    let named: Vec<_> = log
        .lines()
        .filter(|l| l.contains("RUNR_COMMAND cannot be run") && l.contains("/nonexistent/handler"))
        .collect();
    assert_eq!(named.len(), 1, "{log}");
    assert!(named[0].starts_with("[runr-wrapper] ERROR "), "{log}");
    w.child.kill();

    // Not executable: found, but no x bit.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("handler.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let script = script.display().to_string();
    let w = Wrapper::start(&env("exec", &[&script]));
    assert_eq!(w.get("/").header("x-runr-error"), Some("start"));
    assert!(
        w.log().contains("RUNR_COMMAND cannot be run") && w.log().contains(&script),
        "{}",
        w.log()
    );
    // A program found on PATH is not reported.
    let w = Wrapper::start(&env("exec", &["cat"]));
    assert!(!w.log().contains("cannot be run"), "{}", w.log());
}

#[test]
fn persistent_mode_classes() {
    let f = fixtures();
    let mut v = env("persistent", &["python3", "-u", &f.path("worker.py")]);
    v.extend(vars(&[("RUNR_TIMEOUT", "3")]));
    let w = Wrapper::start(&v);
    assert_eq!(w.get_when_up("/").status, 200);
    let r = w.get("/exit");
    assert_eq!(
        (r.status, r.header("x-runr-error"), r.error().as_str()),
        (502, Some("crash"), "handler process exited")
    );
    let r = w.get("/sleep?s=10");
    assert_eq!(
        (r.status, r.header("x-runr-error"), r.error().as_str()),
        (504, Some("timeout"), "handler timed out after 3s")
    );
    assert_eq!(w.get_when_up("/").status, 200);
    let r = w.get("/huge");
    assert_eq!(
        (r.status, r.header("x-runr-error"), r.error().as_str()),
        (502, Some("limit"), "handler output exceeds 10 MiB")
    );
    let r = w.get_when_up("/fine");
    assert_eq!(r.header("x-runr-error"), None, "{}", r.text());
}

#[test]
fn a_workers_own_x_runr_error_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("forger.py");
    std::fs::write(
        &script,
        r#"import json, sys
for line in sys.stdin:
    print(json.dumps({"statusCode": 503, "headers": {"X-RunR-Error": "overload", "X-Other": "kept"}, "body": "busy"}), flush=True)
"#,
    )
    .unwrap();
    let script = script.display().to_string();
    let w = Wrapper::start(&env("persistent", &["python3", "-u", &script]));
    let r = w.get("/");
    assert_eq!((r.status, r.text().as_str()), (503, "busy"));
    assert_eq!(r.header("x-runr-error"), None, "{:?}", r.headers);
    assert_eq!(r.header("x-other"), Some("kept"));
}

#[test]
fn the_observed_proxy_marks_its_own_answers() {
    use crate::observed_support::start_proxy;
    // The program takes 30 s to listen; requests wait RUNR_TICK_WAIT for it.
    let w = start_proxy(&[
        ("RUNR_METRICS_PORT", "0".to_string()),
        ("RUNR_TICK_WAIT", "1s".to_string()),
        ("STARTUP_DELAY", "30".to_string()),
    ]);
    let r = w.get("/");
    assert_eq!(
        (r.status, r.header("x-runr-error"), r.error().as_str()),
        (
            503,
            Some("unavailable"),
            "the function is not listening yet"
        )
    );
    // A probe is not a failed invocation: no class.
    let r = w.send("GET", "/", &[("K-Network-Probe", "1")], b"");
    assert_eq!((r.status, r.header("x-runr-error")), (503, None));
}
