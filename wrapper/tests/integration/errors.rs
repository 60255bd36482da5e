//! X-RunR-Error on every answer the wrapper makes instead of the handler (timeout, crash,
//! start, limit; overload and unavailable where the server makes them), never on the
//! handler's own answers, under concurrency too.

use crate::support::telemetry::vars;
use crate::support::{env, fixtures, Body, Conn, RespExt, Wrapper};

/// Exec handler answering by path (`RUNR_PATH`).
const ROUTED: &str = r#"case "$RUNR_PATH" in
  /own500) printf '{"statusCode":500,"headers":{"X-RunR-Error":"overload"},"body":"mine"}' ;;
  /forged) printf '{"statusCode":200,"headers":{"x-runr-error":["timeout","crash"]},"body":"fine"}' ;;
  /fail) exit 3 ;;
  /sleep) sleep 60 ;;
  /big) head -c 11534336 /dev/zero ;;
  *) printf 'ok %s' "$RUNR_PATH" ;;
esac"#;

fn exec_routed() -> Wrapper {
    let mut v = env("exec", &["bash", "-c", ROUTED]);
    // JSON input: the whole body is read before the handler runs (a raw body is streamed in,
    // and a handler that answers without reading it ends the keep-alive connection).
    v.extend(vars(&[("RUNR_TIMEOUT", "5")]));
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
            r#"{"error":"handler timed out after 5s"}"#,
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
    v.extend(vars(&[("RUNR_TIMEOUT", "5")]));
    let w = Wrapper::start(&v);
    assert_eq!(w.get_when_up("/").status, 200);
    let r = w.get("/exit");
    assert_eq!(
        (r.status, r.header("x-runr-error"), r.error().as_str()),
        (502, Some("crash"), "handler process exited")
    );
    let r = w.get("/sleep?s=60");
    assert_eq!(
        (r.status, r.header("x-runr-error"), r.error().as_str()),
        (504, Some("timeout"), "handler timed out after 5s")
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
    use crate::support::observed::start_proxy;
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

// === every mode, one table ===

/// What a row sends.
#[derive(Debug, Clone, Copy)]
enum Ask {
    /// `GET <path>`.
    Get(&'static str),
    /// `POST /` with a body of this many bytes.
    Post(usize),
    /// `POST /` declaring a body of this many bytes, sending none of it.
    Declared(u64),
    /// `GET /` with one header of 140 KiB (more than execve takes for one variable).
    BigHeader,
    /// `POST /` with a chunked body whose framing is broken.
    BadChunk,
    /// `POST /` declaring 10 bytes and never sending them: the body does not arrive in time.
    NoBody,
    /// `GET /x` while the one slot is held by a `/hold` (the handler is seen running) and no
    /// request may wait.
    WhileBusy,
}

/// One answer to check: the status, the class (`None`: no `X-RunR-Error` at all) and, when
/// given, the body.
#[derive(Debug, Clone, Copy)]
struct Row {
    send: Ask,
    status: u16,
    class: Option<&'static str>,
    body: Option<&'static str>,
}

const fn row(send: Ask, status: u16, class: Option<&'static str>) -> Row {
    Row {
        send,
        status,
        class,
        body: None,
    }
}

const fn own(path: &'static str, status: u16) -> Row {
    Row {
        send: Ask::Get(path),
        status,
        class: None,
        body: Some("mine"),
    }
}

/// An exec handler (JSON input) answering by path. `/own*` set X-RunR-Error themselves.
const EXEC_TABLE_HANDLER: &str = r#"case "$RUNR_PATH" in
  /sleep) sleep 60 ;;
  /hold) touch "$MARK/held"; sleep 60 ;;
  /fail) exit 3 ;;
  /badstatus) printf '{"statusCode":1000}' ;;
  /big) head -c 11534336 /dev/zero ;;
  /own500) printf '{"statusCode":500,"headers":{"X-RunR-Error":"overload"},"body":"mine"}' ;;
  /own404) printf '{"statusCode":404,"headers":{"X-RunR-Error":["crash","limit"]},"body":"mine"}' ;;
  *) printf ok ;;
esac"#;

/// A persistent worker answering by path.
const WORKER_TABLE_HANDLER: &str = r#"import json, os, sys, time
for line in sys.stdin:
    p = json.loads(line)["path"]
    if p == "/exit":
        sys.exit(3)
    if p == "/sleep":
        time.sleep(60)
    if p == "/hold":
        open(os.path.join(os.environ["MARK"], "held"), "w").close()
        time.sleep(60)
    out = {
        "/huge": '"' + "x" * (11 * 1024 * 1024) + '"',
        "/badstatus": json.dumps({"statusCode": 1000}),
        "/own500": json.dumps({"statusCode": 500, "headers": {"X-RunR-Error": "overload"}, "body": "mine"}),
        "/own404": json.dumps({"statusCode": 404, "headers": {"x-runr-error": "crash"}, "body": "mine"}),
    }.get(p, json.dumps({"statusCode": 200, "body": "ok"}))
    print(out, flush=True)
"#;

/// The program behind the observed proxy: a plain http.server.
const UPSTREAM_TABLE_HANDLER: &str = r#"import os, socket, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_GET(self):
        if self.path == "/sleep":
            time.sleep(60)
        if self.path == "/drop":
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        code, forged = {"/own500": (500, "overload"), "/own404": (404, "crash")}.get(self.path, (200, None))
        body = b"mine" if forged else b"ok"
        self.send_response(code)
        if forged:
            self.send_header("X-RunR-Error", forged)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
time.sleep(float(os.environ.get("STARTUP_DELAY", "0")))
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"#;

/// A Lambda function on awslambdaric answering by path.
const LAMBDA_TABLE_HANDLER: &str = r#"import os, time
def handler(event, context):
    p = event.get("rawPath", "")
    if p == "/exit":
        os._exit(3)
    if p == "/sleep":
        time.sleep(60)
    if p == "/hold":
        open(os.path.join(os.environ["MARK"], "held"), "w").close()
        time.sleep(60)
    if p == "/big":
        return {"statusCode": 200, "body": "x" * (7 * 1024 * 1024)}
    if p == "/badstatus":
        return {"statusCode": 1000}
    if p == "/error":
        raise ValueError("mine")
    if p == "/own500":
        return {"statusCode": 500, "headers": {"X-RunR-Error": "overload"}, "body": "mine"}
    if p == "/own404":
        return {"statusCode": 404, "headers": {"x-runr-error": "crash"}, "body": "mine"}
    return {"statusCode": 200, "body": "ok"}
"#;

/// A running wrapper of any mode, and what must live as long as it does.
struct Target {
    addr: std::net::SocketAddr,
    mark: std::path::PathBuf,
    _keep: Box<dyn std::any::Any>,
}

/// The wrapper for `mode` (`exec`, `persistent`, `proxy`, `lambda`) running its table handler;
/// `busy`: one slot and no line, `RUNR_TIMEOUT=60`; else `RUNR_TIMEOUT=5`.
fn table_target(mode: &str, busy: bool, extra: &[(&str, &str)]) -> Target {
    use crate::lambda::support::{awslambdaric, require_python, Function};
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().to_path_buf();
    let mut v = vars(&[
        ("MARK", mark.to_str().unwrap()),
        ("RUNR_TIMEOUT", if busy { "60" } else { "5" }),
    ]);
    if busy {
        v.extend(vars(&[
            ("RUNR_MAX_INFLIGHT", "1"),
            ("RUNR_WORKERS", "1"),
            ("RUNR_MAX_QUEUE", "0"),
        ]));
    }
    v.extend(vars(extra));
    // A program that serves is up before the rows' clock starts (a short RUNR_TIMEOUT must not
    // count its start); one that never does is the row.
    let serves = !extra
        .iter()
        .any(|(k, _)| ["RUNR_COMMAND", "APP", "STARTUP_DELAY"].contains(k));
    let (addr, keep): (_, Box<dyn std::any::Any>) = match mode {
        "exec" => {
            let mut all = env("exec", &["bash", "-c", EXEC_TABLE_HANDLER]);
            all.extend(v);
            let w = Wrapper::start(&all);
            (w.addr(), Box::new(w))
        }
        "persistent" => {
            let script = dir.path().join("worker.py");
            std::fs::write(&script, WORKER_TABLE_HANDLER).unwrap();
            let mut all = env("persistent", &["python3", "-u", script.to_str().unwrap()]);
            all.extend(v);
            let w = Wrapper::start(&all);
            if serves {
                w.get_when_up("/ok");
            }
            (w.addr(), Box::new(w))
        }
        "proxy" => {
            let script = dir.path().join("upstream.py");
            std::fs::write(&script, UPSTREAM_TABLE_HANDLER).unwrap();
            let mut all = env("http", &["python3", script.to_str().unwrap()]);
            all.extend(vars(&[
                // The observed proxy runs for metrics alone too.
                ("RUNR_METRICS_PORT", "0"),
                ("RUNR_UPSTREAM_PORT", &runr_testkit::free_port().to_string()),
            ]));
            all.extend(v);
            let w = crate::support::observed::Proxy::start(&all);
            (w.addr(), Box::new(w))
        }
        "lambda" => {
            require_python("awslambdaric");
            let command = awslambdaric("app.handler");
            let mut all: Vec<(&str, &str)> =
                vec![("RUNR_COMMAND", &command), ("RUNR_HANDLER", "app.handler")];
            all.extend(v.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            let app = extra
                .iter()
                .find(|(k, _)| *k == "APP")
                .map_or(LAMBDA_TABLE_HANDLER, |(_, text)| text);
            let f = Function::start(&[("app.py", app)], &all);
            if serves {
                f.wait_ready();
            }
            (f.addr(), Box::new(f))
        }
        other => panic!("no mode {other}"),
    };
    Target {
        addr,
        mark,
        _keep: Box::new((keep, dir)),
    }
}

/// Sends a row's request and returns the answer.
fn send_row(t: &Target, send: Ask) -> crate::support::Resp {
    use std::io::Write;
    let raw = |bytes: &[u8]| {
        let mut c = Conn::open(t.addr);
        c.stream().write_all(bytes).unwrap();
        c.read_response()
    };
    match send {
        Ask::Get(path) => Conn::open(t.addr).send("GET", path, &[], Body::None),
        Ask::Post(n) => Conn::open(t.addr).send("POST", "/", &[], Body::Sized(&vec![b'x'; n])),
        Ask::Declared(n) => {
            raw(format!("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: {n}\r\n\r\n").as_bytes())
        }
        Ask::BigHeader => {
            let big = "v".repeat(140 * 1024);
            Conn::open(t.addr).send("GET", "/", &[("X-Big", &big)], Body::None)
        }
        Ask::BadChunk => {
            raw(b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n")
        }
        Ask::NoBody => raw(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n"),
        Ask::WhileBusy => {
            let addr = t.addr;
            // Held until the wrapper is stopped with the test.
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                let _ = c
                    .stream()
                    .write_all(b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n");
                let _ = c.try_read_response();
            });
            let held = t.mark.join("held");
            runr_testkit::wait_for(
                "the slot to be held",
                std::time::Duration::from_secs(60),
                || held.exists().then_some(()),
            );
            Conn::open(t.addr).send("GET", "/x", &[], Body::None)
        }
    }
}

/// Checks every row against `t`; the mismatches, described.
fn check_rows(mode: &str, t: &Target, rows: &[Row]) -> Vec<String> {
    let mut wrong = Vec::new();
    for r in rows {
        let got = send_row(t, r.send);
        let classes = got.headers_named("x-runr-error");
        let want: Vec<&str> = r.class.into_iter().collect();
        let body_ok = r.body.is_none_or(|b| got.text() == b);
        // A wrapper answer is always `{"error": ...}`.
        let shape_ok = r.class.is_none()
            || serde_json::from_slice::<serde_json::Value>(&got.body)
                .is_ok_and(|v| v["error"].is_string());
        if got.status != r.status || classes != want || !body_ok || !shape_ok {
            wrong.push(format!(
                "{mode} {:?}: got {} {classes:?} {:?}, want {} {want:?} {:?}",
                r.send,
                got.status,
                got.text().chars().take(120).collect::<String>(),
                r.status,
                r.body
            ));
        }
    }
    wrong
}

/// The rows one wrapper of `mode` answers (`busy`: see [`table_target`]).
struct Plan {
    mode: &'static str,
    busy: bool,
    rows: Vec<Row>,
}

impl Plan {
    fn new(mode: &'static str, busy: bool, rows: Vec<Row>) -> Plan {
        Plan { mode, busy, rows }
    }
}

#[test]
fn every_wrapper_answer_carries_its_class_and_no_program_answer_does_in_every_mode() {
    use runr_testkit::MIB;
    use Ask::*;
    let shared = [
        row(Declared(10 * MIB as u64 + 1), 413, Some("limit")),
        row(BadChunk, 400, Some("request")),
        row(NoBody, 408, Some("request")),
        row(Get("/ok"), 200, None),
        own("/own500", 500),
        own("/own404", 404),
    ];
    let exec = [
        row(Get("/sleep"), 504, Some("timeout")),
        row(Get("/fail"), 500, Some("crash")),
        row(Get("/badstatus"), 500, Some("crash")),
        row(Get("/big"), 502, Some("limit")),
        row(BigHeader, 431, Some("limit")),
    ];
    let persistent = [
        row(Get("/sleep"), 504, Some("timeout")),
        row(Get("/exit"), 502, Some("crash")),
        row(Get("/badstatus"), 500, Some("crash")),
        row(Get("/huge"), 502, Some("limit")),
    ];
    let proxy = [
        row(Get("/sleep"), 504, Some("timeout")),
        row(Get("/drop"), 502, Some("crash")),
        row(Get("/ok"), 200, None),
        own("/own500", 500),
        own("/own404", 404),
    ];
    let lambda = [
        row(Get("/sleep"), 504, Some("timeout")),
        row(Get("/exit"), 502, Some("crash")),
        row(Get("/badstatus"), 502, Some("crash")),
        row(Get("/big"), 502, Some("limit")),
        row(Post(6 * MIB + 1), 413, Some("limit")),
        // A function error is the function's own answer.
        row(Get("/error"), 502, None),
    ];
    let busy = [row(WhileBusy, 503, Some("overload"))];
    let broken_app = "raise RuntimeError('the module does not import')\n";
    let with_shared = |rows: &[Row]| [rows, &shared[..]].concat();
    // Each on a wrapper of its own, the modes at once.
    let plan = [
        Plan::new("exec", false, with_shared(&exec)),
        Plan::new("exec", true, busy.to_vec()),
        Plan::new("persistent", false, with_shared(&persistent)),
        Plan::new("persistent", true, busy.to_vec()),
        Plan::new("proxy", false, proxy.to_vec()),
        Plan::new("lambda", false, with_shared(&lambda)),
        Plan::new("lambda", true, busy.to_vec()),
    ];
    let start = [
        row(Get("/"), 500, Some("start")),
        row(Get("/"), 502, Some("start")),
        row(Get("/"), 503, Some("unavailable")),
        row(Get("/"), 504, Some("timeout")),
    ];
    let wrong = std::thread::scope(|s| {
        let mut runs: Vec<_> = plan
            .iter()
            .map(|p| {
                s.spawn(move || {
                    let t = table_target(p.mode, p.busy, &[]);
                    check_rows(p.mode, &t, &p.rows)
                })
            })
            .collect();
        // Programs that never serve: exec cannot start it (start); a Lambda runtime whose
        // init fails (start); the observed proxy's program never listens in time
        // (unavailable); a persistent worker that cannot start leaves the request waiting
        // for its timeout (timeout).
        let never = [
            (
                "exec",
                vec![("RUNR_COMMAND", r#"["/nonexistent/handler"]"#)],
                &start[0],
            ),
            ("lambda", vec![("APP", broken_app)], &start[1]),
            (
                "proxy",
                vec![("STARTUP_DELAY", "60"), ("RUNR_TICK_WAIT", "1s")],
                &start[2],
            ),
            (
                "persistent",
                vec![("RUNR_COMMAND", r#"["/nonexistent/worker"]"#)],
                &start[3],
            ),
        ];
        for (mode, extra, r) in never {
            runs.push(s.spawn(move || {
                let t = table_target(mode, false, &extra);
                check_rows(&format!("{mode} (never serves)"), &t, &[*r])
            }));
        }
        runs.into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
