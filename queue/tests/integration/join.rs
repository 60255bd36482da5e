//! Where the queue meets the wrapper: the consumer's retry and dead-letter rules against the
//! answers the real runr-wrapper makes in each of its modes (exec, persistent, http behind the
//! observed proxy, lambda). The wrapper's own answers carry their `X-RunR-Error` class; the
//! program's do not, even when the program sets that header itself.
//!
//! Every mode gets the same consumer: `RUNR_QUEUE_DEAD_LETTER_AT_ONCE=limit,timeout,422`, two
//! attempts. A listed class or status is dead-lettered after one attempt, anything else after
//! two, and the dead letter keeps the class the wrapper sent. Where the wrapper has a fixed set
//! of handlers (persistent workers, Lambda runtimes), entries go one at a time, so that none
//! waits for one that another entry killed (waiting counts against `RUNR_TIMEOUT`).

use std::path::Path;
use std::process::Command;

use runr_testkit::redis::Redis;
use runr_testkit::{wait_for, Server};

use crate::support::*;

/// One entry's `do` field, and what must become of it: `None` acknowledged, or the dead
/// letter's (status, runr-error, attempts).
type Case = (
    &'static str,
    Option<(&'static str, &'static str, &'static str)>,
);

/// What an exec or persistent handler does with `do` (JSON answers are response envelopes).
const EXEC_HANDLER: &str = r#"#!/usr/bin/env bash
set -euo pipefail
body=$(cat)
case "$body" in
  *'"do":"crash"'*) echo "crashing on purpose" >&2; exit 3 ;;
  *'"do":"sleep"'*) sleep 30 ;;
  *'"do":"own422"'*) printf '{"statusCode":422,"body":"bad input"}' ;;
  *'"do":"forged"'*) printf '{"statusCode":500,"headers":{"X-RunR-Error":"limit"},"body":"mine"}' ;;
  *) printf 'ok' ;;
esac
"#;

/// The same as a persistent worker: one JSON envelope a line in, one answer a line out.
const WORKER: &str = r#"import json, os, sys, time
for line in sys.stdin:
    do = json.loads(json.loads(line)["body"]).get("do", "")
    if do == "crash":
        os._exit(3)
    if do == "sleep":
        time.sleep(30)
    answer = {"statusCode": 200, "body": "ok"}
    if do == "own422":
        answer = {"statusCode": 422, "body": "bad input"}
    if do == "forged":
        answer = {"statusCode": 500, "headers": {"X-RunR-Error": "limit"}, "body": "mine"}
    print(json.dumps(answer), flush=True)
"#;

/// An http-mode program (threaded: a sleeping request does not hold the others).
const UPSTREAM: &str = r#"import http.server, json, os, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        do = json.loads(self.rfile.read(n) or b"{}").get("do", "")
        if do == "sleep":
            time.sleep(30)
        status, body = (422, b"bad input") if do == "own422" else (200, b"ok")
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"#;

/// A Lambda function on awslambdaric, answering the queue trigger's SQS event.
const LAMBDA_APP: &str = r#"import json, os, time
def handler(event, context):
    record = event["Records"][0]
    do = json.loads(record["body"]).get("do", "")
    if do == "crash":
        os._exit(3)
    if do == "raise":
        raise ValueError("cannot process this entry")
    if do == "sleep":
        time.sleep(30)
    if do == "partial":
        return {"batchItemFailures": [{"itemIdentifier": record["messageId"]}]}
    return {}
"#;

/// The wrapper, stopped with SIGTERM when dropped: its programs (an http-mode server, Lambda
/// runtimes, persistent workers) lead process groups of their own, which only the wrapper's
/// own shutdown reaches.
struct Wrapper(Server);

impl Drop for Wrapper {
    fn drop(&mut self) {
        self.0.child.signal(nix::sys::signal::Signal::SIGTERM);
        let child = self.0.child.inner();
        for _ in 0..2000 {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

fn start_wrapper(dir: &Path, vars: &[(&str, &str)]) -> Wrapper {
    let mut cmd = Command::new(runr_testkit::workspace_bin("runr-wrapper"));
    cmd.current_dir(dir)
        .env("RUNR_TRIGGER", "queue")
        // Far above a normal answer's milliseconds, far below the sleeping handlers' 30 s.
        .env("RUNR_TIMEOUT", "3")
        .env("RUNR_UPSTREAM_PORT", runr_testkit::free_port().to_string())
        .envs(vars.iter().copied());
    Wrapper(Server::start(cmd, &dir.join("wrapper.log")))
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

fn through(mode: &str, wrapper: &Wrapper, dir: &Path, concurrency: &str, cases: &[Case]) {
    let redis = Redis::start();
    let target = format!("http://{}/", wrapper.0.addr);
    let mut c = Consumer::start(
        dir,
        "c1",
        &with(
            base_env(&redis, &target, "c1"),
            &[
                ("RUNR_QUEUE_DEAD_LETTER_AT_ONCE", "limit,timeout,422"),
                ("RUNR_QUEUE_MAX_ATTEMPTS", "2"),
                ("RUNR_QUEUE_BACKOFF", "10ms"),
                ("RUNR_QUEUE_BACKOFF_MAX", "10ms"),
                ("RUNR_QUEUE_CONCURRENCY", concurrency),
            ],
        ),
    );
    let mut conn = redis.conn();
    let ids: Vec<String> = cases
        .iter()
        .map(|(what, _)| conn.xadd(STREAM, &[("do", what)]))
        .collect();
    let dead_count = cases.iter().filter(|(_, d)| d.is_some()).count();
    let acked = cases.len() - dead_count;
    wait_for(&format!("{mode}: every entry's fate"), LONG, || {
        (conn.pending(STREAM, GROUP) == 0
            && conn.cmd_str(&["XLEN", DLQ]).int() as usize == dead_count
            && c.delivered().len() == acked)
            .then_some(())
    });
    let dead = conn.xrange(DLQ);
    for (id, (what, fate)) in ids.iter().zip(cases) {
        let letter = dead
            .iter()
            .find(|(_, f)| f.iter().any(|(k, v)| k == "runr-id" && v == id));
        match (fate, letter) {
            (None, None) => {}
            (Some((status, class, attempts)), Some((_, f))) => {
                let get = |k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
                assert_eq!(
                    (get("runr-status"), get("runr-error"), get("runr-attempts")),
                    (Some(*status), Some(*class), Some(*attempts)),
                    "{mode}: {what}\n{}",
                    c.log()
                );
            }
            (want, got) => panic!("{mode}: {what}: want {want:?}, got {got:?}\n{}", c.log()),
        }
    }
    c.stop_cleanly();
}

#[test]
fn exec_mode() {
    let dir = tmp();
    let script = write(dir.path(), "main.sh", EXEC_HANDLER);
    let command = serde_json::to_string(&["bash", &script]).unwrap();
    let w = start_wrapper(
        dir.path(),
        &[
            ("RUNR_WRAPPER_MODE", "exec"),
            ("RUNR_INPUT", "raw"),
            ("RUNR_COMMAND", &command),
        ],
    );
    // One at a time: the wrapper's exec mode cuts answers under concurrency.
    through(
        "exec",
        &w,
        dir.path(),
        "1",
        &[
            ("ok", None),
            ("crash", Some(("500", "crash", "2"))),
            ("sleep", Some(("504", "timeout", "1"))),
            ("own422", Some(("422", "", "1"))),
            // The program's own X-RunR-Error is not the wrapper's: not listed, retried.
            ("forged", Some(("500", "", "2"))),
        ],
    );
}

#[test]
fn persistent_mode() {
    let dir = tmp();
    let worker = write(dir.path(), "worker.py", WORKER);
    let command = serde_json::to_string(&["python3", &worker]).unwrap();
    let w = start_wrapper(
        dir.path(),
        &[
            ("RUNR_WRAPPER_MODE", "persistent"),
            // More workers than entries that kill one: the next entry never waits for a
            // restart (waiting counts against RUNR_TIMEOUT).
            ("RUNR_WORKERS", "4"),
            ("RUNR_COMMAND", &command),
        ],
    );
    through(
        "persistent",
        &w,
        dir.path(),
        "1",
        &[
            ("ok", None),
            ("crash", Some(("502", "crash", "2"))),
            ("sleep", Some(("504", "timeout", "1"))),
            ("own422", Some(("422", "", "1"))),
            ("forged", Some(("500", "", "2"))),
        ],
    );
}

#[test]
fn http_mode_behind_the_observed_proxy() {
    let dir = tmp();
    let program = write(dir.path(), "server.py", UPSTREAM);
    let command = serde_json::to_string(&["python3", &program]).unwrap();
    // Tracing puts the wrapper's proxy in the path; plain http mode execs the program and
    // makes no answer of its own.
    let w = start_wrapper(
        dir.path(),
        &[
            ("RUNR_WRAPPER_MODE", "http"),
            ("RUNR_TRACING", "1"),
            ("RUNR_COMMAND", &command),
        ],
    );
    through(
        "http",
        &w,
        dir.path(),
        "4",
        &[
            ("ok", None),
            ("sleep", Some(("504", "timeout", "1"))),
            ("own422", Some(("422", "", "1"))),
        ],
    );
}

#[test]
fn lambda_mode() {
    let dir = tmp();
    write(dir.path(), "app.py", LAMBDA_APP);
    let w = start_wrapper(
        dir.path(),
        &[
            ("RUNR_WRAPPER_MODE", "lambda"),
            // More workers than entries that kill one: the next entry never waits for a
            // restart (waiting counts against RUNR_TIMEOUT).
            ("RUNR_WORKERS", "4"),
            (
                "RUNR_COMMAND",
                r#"["python3", "-m", "awslambdaric", "app.handler"]"#,
            ),
        ],
    );
    through(
        "lambda",
        &w,
        dir.path(),
        "1",
        &[
            ("ok", None),
            // The runtime died: the wrapper's answer.
            ("crash", Some(("502", "crash", "2"))),
            // The function's own error document: its answer, no class.
            ("raise", Some(("502", "", "2"))),
            ("sleep", Some(("504", "timeout", "1"))),
            // batchItemFailures naming the message.
            ("partial", Some(("500", "", "2"))),
        ],
    );
}

/// The producer's trace, through the queue, into the function: the consumer's delivery span
/// continues the producer's span, and the wrapper's server span continues the delivery span,
/// both exported to one collector.
#[test]
fn the_wrappers_span_is_a_child_of_the_delivery_span() {
    const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let dir = tmp();
    let collector = runr_testkit::otlp::Collector::start();
    let endpoint = format!("http://127.0.0.1:{}", collector.port);
    let script = write(dir.path(), "main.sh", EXEC_HANDLER);
    let command = serde_json::to_string(&["bash", &script]).unwrap();
    let w = start_wrapper(
        dir.path(),
        &[
            ("RUNR_WRAPPER_MODE", "exec"),
            ("RUNR_INPUT", "raw"),
            ("RUNR_COMMAND", &command),
            ("RUNR_TRACING", "1"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("OTEL_SERVICE_NAME", "orders-fn"),
        ],
    );
    let redis = Redis::start();
    let target = format!("http://{}/", w.0.addr);
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &target, "c1"),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
                ("OTEL_BSP_SCHEDULE_DELAY", "50"),
                ("OTEL_SERVICE_NAME", "orders-queue"),
            ],
        ),
    );
    let mut conn = redis.conn();
    let id = conn.xadd(STREAM, &[("do", "ok"), ("traceparent", PRODUCER)]);
    c.wait_delivered(1);
    // Two spans, in one export or two, in either order.
    let (docs, spans) = collector.spans_until(LONG, |s| s.len() >= 2);
    c.stop_cleanly();
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let kind = |k: i64| {
        spans
            .iter()
            .find(|s| s["kind"] == k)
            .unwrap_or_else(|| panic!("a span of kind {k}: {spans:#?}"))
    };
    let (delivery, server) = (kind(5), kind(2));
    assert_eq!(delivery["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(delivery["parentSpanId"], "00f067aa0ba902b7");
    let message_id = runr_testkit::otlp::attr(&delivery["attributes"], "messaging.message.id");
    assert_eq!(message_id["stringValue"].as_str(), Some(id.as_str()));
    assert_eq!(server["traceId"], delivery["traceId"], "one trace");
    assert_eq!(
        server["parentSpanId"], delivery["spanId"],
        "the wrapper continues the delivery span: {spans:#?}"
    );
    let status = runr_testkit::otlp::attr(&server["attributes"], "http.response.status_code");
    assert_eq!(status["intValue"], "200");
    // Each binary under its own service name and scope.
    let mut services: Vec<(String, String)> = docs
        .iter()
        .flat_map(|d| d["resourceSpans"].as_array().unwrap().clone())
        .map(|rs| {
            let name = runr_testkit::otlp::attr(&rs["resource"]["attributes"], "service.name");
            (
                name["stringValue"].as_str().unwrap().to_string(),
                rs["scopeSpans"][0]["scope"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    services.sort();
    services.dedup();
    assert_eq!(
        services,
        [
            ("orders-fn".to_string(), "runr-wrapper".to_string()),
            ("orders-queue".to_string(), "runr-queue".to_string())
        ]
    );
}
