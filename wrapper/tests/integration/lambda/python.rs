//! Python functions on awslambdaric (PyPI): HTTP, queue and schedule events read through
//! aws-lambda-powertools' data classes, results, function and init errors, timeouts, exits,
//! the payload limits, many clients over several runtimes, the emulator's invoke API, tracing,
//! SIGTERM, and an ASGI app through mangum.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use runr_testkit::{wait_for, Child};
use serde_json::{json, Value};

use super::support::{awslambdaric, require_python, Function};
use super::{bodies, fixture};
use crate::support::observed::{access_lines, finish, replay_lines};
use crate::support::{alive, bin, Body, Conn, RespExt};

fn app(vars: &[(&str, &str)]) -> Function {
    require_python("awslambdaric");
    require_python("aws_lambda_powertools");
    let command = awslambdaric("app.handler");
    let mut all = vec![
        ("RUNR_COMMAND", command.as_str()),
        ("RUNR_HANDLER", "app.handler"),
    ];
    all.extend_from_slice(vars);
    Function::start(&[("app.py", &fixture("app.py"))], &all)
}

fn pid_of(r: &crate::support::Resp) -> i32 {
    r.header("x-pid").unwrap().parse().unwrap()
}

#[test]
fn an_http_request_reaches_the_handler_as_api_gateway_2_0() {
    let f = app(&[
        ("RUNR_REGION", "eu-west-1"),
        ("K_SERVICE", "orders"),
        ("K_REVISION", "orders-00001"),
    ]);
    let expect = json!({
        "version": "2.0",
        "routeKey": "$default",
        "method": "POST",
        "rawPath": "/orders/a%20b",
        "path": "/orders/a b",
        "protocol": "HTTP/1.1",
        "rawQueryString": "x=1&x=2&name=Run%20R&plus=a+b",
        "query": {"x": "1,2", "name": "Run R", "plus": "a b"},
        "cookies": ["c1=v1", "c2=v2", "c3=v3"],
        "body": "hello λ",
        "isBase64Encoded": false,
        "sourceIp": "203.0.113.9",
        "userAgent": "test-agent/1.0",
        "domainName": "orders.example.com",
        "domainPrefix": "orders",
        "stage": "$default",
        "requestId": "req-42",
        "accountId": "000000000000",
        "functionName": "orders",
        "functionVersion": "orders-00001",
        "invokedFunctionArn": "arn:aws:lambda:eu-west-1:000000000000:function:orders",
        "logGroup": "/aws/lambda/orders",
    });
    let expect_header = expect.to_string().replace("λ", "\\u03bb");
    let r = f.send(
        "POST",
        "/orders/a%20b?x=1&x=2&name=Run%20R&plus=a+b",
        &[
            ("Host", "orders.example.com:8080"),
            ("Cookie", "c1=v1; c2=v2"),
            ("Cookie", "c3=v3"),
            ("User-Agent", "test-agent/1.0"),
            ("X-Forwarded-For", "203.0.113.9, 10.0.0.1"),
            ("X-Multi", "a"),
            ("X-Multi", "b"),
            ("X-Request-Id", "req-42"),
            ("X-Expect", &expect_header),
        ],
        "hello λ".as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    let seen = r.json();
    // What the handler compared is also what it answers.
    for (k, v) in expect.as_object().unwrap() {
        assert_eq!(&seen[k], v, "{k}");
    }
    let headers = &seen["headers"];
    assert_eq!(headers["x-multi"], "a,b");
    assert_eq!(headers["host"], "orders.example.com:8080");
    assert!(
        headers.get("cookie").is_none(),
        "cookies move to `cookies`: {headers}"
    );
    assert_eq!(seen["awsRequestId"].as_str().unwrap().len(), 36, "a UUID");
    let epoch = seen["timeEpoch"].as_u64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(epoch <= now && now - epoch < 60_000, "{epoch} vs {now}");
    let remaining = seen["remainingMs"].as_i64().unwrap();
    assert!(remaining > 0 && remaining <= 30_000, "{remaining}");
    assert!(
        seen["memoryLimitInMB"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    assert!(seen["logStream"]
        .as_str()
        .unwrap()
        .contains("/[orders-00001]"));
    let env = &seen["env"];
    let root = f.root.path().canonicalize().unwrap();
    assert_eq!(env["_HANDLER"], "app.handler");
    assert_eq!(env["LAMBDA_TASK_ROOT"], root.to_str().unwrap());
    assert_eq!(seen["cwd"], root.to_str().unwrap());
    assert_eq!(env["LAMBDA_RUNTIME_DIR"], "/var/runtime");
    assert_eq!(env["AWS_REGION"], "eu-west-1");
    assert_eq!(env["AWS_DEFAULT_REGION"], "eu-west-1");
    assert_eq!(env["AWS_LAMBDA_INITIALIZATION_TYPE"], "on-demand");
    let tz = std::env::var("TZ").unwrap_or_else(|_| ":UTC".into());
    assert_eq!(env["TZ"], tz.as_str());

    // A mismatch found inside the handler is a failed invocation: the check can fail.
    let r = f.send("GET", "/x", &[("X-Expect", r#"{"rawPath": "/y"}"#)], b"");
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.error().contains("rawPath"), "{}", r.text());

    // A body that is not UTF-8 arrives base64.
    let r = f.send(
        "PUT",
        "/bin",
        &[(
            "X-Expect",
            r#"{"isBase64Encoded": true, "body": "ff00fe", "query": {}}"#,
        )],
        &[0xff, 0x00, 0xfe],
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn results_map_back_as_api_gateway_does() {
    let f = app(&[]);
    let r = f.get("/shapes");
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/html"));
    assert_eq!(r.header("x-num"), Some("7"));
    assert_eq!(r.headers_named("set-cookie"), ["a=1; Path=/", "b=2"]);
    assert_eq!(r.text(), "<b>created</b>");
    // Any other JSON: 200 application/json with that JSON.
    let r = f.get("/plain");
    assert_eq!(
        (r.status, r.header("content-type"), r.text().as_str()),
        (200, Some("application/json"), "\"just a string\"")
    );
}

#[test]
fn function_errors_are_502_with_their_type_and_the_runtime_lives_on() {
    let f = app(&[]);
    let pid = pid_of(&f.get("/"));
    let r = f.get("/error?why=bad%20input");
    assert_eq!(r.status, 502);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.json(),
        json!({"error": "boom: bad input", "errorType": "ValueError"})
    );
    let r = f.get("/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        pid_of(&r),
        pid,
        "a function error does not restart the runtime"
    );
}

/// A function whose error messages are as long as the event (or an HTTP request's body) asks
/// (`{"mib": n}` of them), and that answers its client context's `custom` part.
const LARGE_ERRORS: &str = r#"import json, os
def handler(event, context):
    if "rawPath" in event:
        # An HTTP request: what it asks is in its body.
        event = json.loads(event.get("body") or "{}")
    if "mib" in event:
        raise ValueError("m" * int(event["mib"] * 1024 * 1024))
    cc = context.client_context
    return {"custom": cc.custom if cc else None, "pid": os.getpid()}
"#;

fn large_errors() -> Function {
    require_python("awslambdaric");
    let command = awslambdaric("app.handler");
    Function::start(
        &[("app.py", LARGE_ERRORS)],
        &[
            ("RUNR_COMMAND", command.as_str()),
            ("RUNR_LAMBDA_INVOKE_API", "1"),
        ],
    )
}

const INVOKE: &str = "/2015-03-31/functions/function/invocations";

#[test]
fn error_documents_up_to_6_mib_keep_their_message_and_type() {
    let f = large_errors();
    let pid = f.post(INVOKE, b"{}").json()["pid"].clone();
    for mib in [1.5, 5.0] {
        let event = format!(r#"{{"mib": {mib}}}"#);
        let len = (mib * 1024.0 * 1024.0) as usize;
        // The invoke API answers the document as the runtime sent it.
        let r = f.post(INVOKE, event.as_bytes());
        assert_eq!(
            (r.status, r.header("x-amz-function-error")),
            (200, Some("Unhandled"))
        );
        let doc = r.json();
        assert_eq!(doc["errorType"], "ValueError", "{mib} MiB");
        assert_eq!(doc["errorMessage"].as_str().map(str::len), Some(len));
        // An HTTP client gets the type and the message's first 4 KiB, in well-formed JSON.
        let r = f.send(
            "POST",
            "/",
            &[("content-type", "application/json")],
            event.as_bytes(),
        );
        assert_eq!((r.status, r.header("x-runr-error")), (502, None));
        let got = r.json();
        assert_eq!(got["errorType"], "ValueError", "{mib} MiB");
        assert_eq!(got["error"], "m".repeat(4096), "{mib} MiB");
    }
    // Function errors leave the runtime running.
    assert_eq!(f.post(INVOKE, b"{}").json()["pid"], pid);
    // Above the limit: the runtime is told (413) and the client gets the wrapper's 502.
    let r = f.post(INVOKE, br#"{"mib": 7}"#);
    assert_eq!(
        (
            r.status,
            r.header("x-runr-error"),
            r.json()["error"].as_str()
        ),
        (
            502,
            Some("limit"),
            Some("the function's error document exceeds 6 MiB")
        )
    );
    // awslambdaric exits when the Runtime API refuses a post; the next invocation is served
    // (by the runtime started again).
    let r = f.post(INVOKE, b"{}");
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn the_invoke_apis_client_context_reaches_context_client_context() {
    use base64::Engine;
    let f = large_errors();
    let addr = f.addr();
    // Concurrent callers, each with a context of its own.
    let threads: Vec<_> = (0..6)
        .map(|i| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                for n in 0..5 {
                    let custom = json!({"caller": i, "n": n, "note": "é ünïcode"});
                    let context = json!({"custom": custom, "client": {"app_title": "t"}});
                    let b64 = base64::engine::general_purpose::STANDARD.encode(context.to_string());
                    let r = c.send(
                        "POST",
                        INVOKE,
                        &[("X-Amz-Client-Context", &b64)],
                        Body::Sized(b"{}"),
                    );
                    assert_eq!(r.status, 200, "{}", r.text());
                    assert_eq!(r.json()["custom"], custom);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // None sent, none seen.
    assert_eq!(f.post(INVOKE, b"{}").json()["custom"], Value::Null);
    // Not base64 of a JSON object: the caller's mistake, refused before the function runs.
    for bad in ["%%%", "WzFd", "bm90IGpzb24="] {
        let r = f.send("POST", INVOKE, &[("X-Amz-Client-Context", bad)], b"{}");
        assert_eq!(
            (r.status, r.header("x-runr-error")),
            (400, Some("request")),
            "{bad}: {}",
            r.text()
        );
    }
}

#[test]
fn an_init_error_answers_the_waiting_invocation_and_the_runtime_is_restarted() {
    require_python("awslambdaric");
    let broken = "raise RuntimeError('cannot connect to the database')\n";
    let command = awslambdaric("app.handler");
    let f = Function::start(
        &[("app.py", broken)],
        &[("RUNR_COMMAND", &command), ("RUNR_TIMEOUT", "20")],
    );
    let r = f.get("/");
    // Answered with the init error, not after the 20 s timeout.
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"error": "cannot connect to the database", "errorType": "RuntimeError"})
    );
    let probe = f.send("GET", "/", &[("K-Kubelet-Probe", "1")], b"");
    assert_eq!(probe.status, 503, "not ready: {}", probe.text());
    assert_eq!(probe.error(), "the function is not ready");
    wait_for("two restarts", Duration::from_secs(30), || {
        (f.log().matches("runtime started").count() >= 3).then_some(())
    });
    let log = f.log();
    assert!(
        log.contains("the runtime reported an init error slot=0 error_type=RuntimeError"),
        "{log}"
    );
    assert!(log.contains("restarting runtime slot=0"), "{log}");
}

#[test]
fn a_runtime_that_initialises_on_its_second_start_becomes_ready() {
    require_python("awslambdaric");
    // Fails the first import (leaving a marker), works from then on.
    let flaky = "import os\nif not os.path.exists('started-once'):\n    open('started-once', 'w').close()\n    raise ImportError('not yet')\ndef handler(event, context):\n    return {'statusCode': 200, 'body': 'second start'}\n";
    let command = awslambdaric("app.handler");
    let f = Function::start(&[("app.py", flaky)], &[("RUNR_COMMAND", &command)]);
    f.wait_log("the runtime reported an init error");
    wait_for("the probe to pass", Duration::from_secs(30), || {
        let p = f.send("GET", "/", &[("K-Network-Probe", "queue")], b"");
        (p.status == 200).then_some(p)
    });
    let r = f.get("/");
    assert_eq!((r.status, r.text().as_str()), (200, "second start"));
}

#[test]
fn the_timeout_kills_the_runtime_group_and_a_new_runtime_serves_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    let f = app(&[("RUNR_TIMEOUT", "3")]);
    f.wait_ready();
    let runtime = pid_of(&f.get("/"));
    let r = f.get(&format!("/grandchild?file={}", pidfile.display()));
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.error(), "handler timed out after 3s");
    let grandchild: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_for(
        "the runtime and its child to be gone",
        Duration::from_secs(60),
        || (!alive(runtime) && !alive(grandchild)).then_some(()),
    );
    f.wait_log("restarting runtime slot=0");
    f.wait_ready();
    let r = f.get("/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ne!(pid_of(&r), runtime);
    assert!(f
        .log()
        .contains("runtime ran into the timeout; killing its process group"));
}

#[test]
fn a_runtime_exiting_mid_invocation_is_502_and_restarted() {
    let f = app(&[]);
    let runtime = pid_of(&f.get("/"));
    let r = f.get("/exit");
    assert_eq!(r.status, 502);
    assert_eq!(r.error(), "handler process exited");
    let r = f.get("/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ne!(pid_of(&r), runtime);
}

#[test]
fn six_mib_limits_for_events_and_results() {
    let f = app(&[]);
    let r = f.post("/echo", &vec![b'a'; 6 * 1024 * 1024 + 1]);
    assert_eq!(r.status, 413);
    assert_eq!(r.error(), "request body exceeds 6 MiB");
    // 5 MiB of binary is over 6 MiB as base64 in the event.
    let r = f.post("/echo", &vec![0xff; 5 * 1024 * 1024]);
    assert_eq!(r.status, 413);
    assert_eq!(r.error(), "the event payload exceeds 6 MiB");
    // A result above 6 MiB: the runtime gets 413, the client 502.
    let r = f.get("/big");
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.error(), "the function's response exceeds 6 MiB");
    // Just under the limit works both ways.
    let body = vec![b'z'; 4 * 1024 * 1024];
    let r = f.post("/echo", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.body == body);
}

#[test]
fn many_clients_over_four_runtimes_every_answer_exact() {
    let f = app(&[("RUNR_WORKERS", "4")]);
    f.wait_runtimes(4);
    let addr = f.addr();
    let handles: Vec<_> = (0..24)
        .map(|t| {
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                let bodies = bodies();
                for i in 0..5 {
                    let body = &bodies[(t + i) % bodies.len()];
                    let r = conn.send("POST", "/echo", &[], Body::Sized(body));
                    assert_eq!(r.status, 200, "{}", r.text());
                    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
                    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
                    assert_eq!(r.body.len(), body.len());
                    assert!(r.body == *body, "body of {} bytes differs", body.len());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let log = f.log();
    let busy: HashSet<usize> = (0..4)
        .filter(|s| log.contains(&format!("runtime api slot={s} method=POST")))
        .collect();
    assert!(busy.len() >= 2, "only runtimes {busy:?} answered");
}

/// Admission control in lambda mode: one invocation per runtime at once, `RUNR_MAX_QUEUE` in
/// line, the rest 503 `overloaded` at once.
#[test]
fn two_runtimes_three_in_line_the_rest_503_overloaded() {
    let gate = crate::support::Gate::new();
    let (gate_var, gate_path) = gate.var();
    let f = app(&[
        ("RUNR_WORKERS", "2"),
        ("RUNR_MAX_QUEUE", "3"),
        ("RUNR_TIMEOUT", "300"),
        (&gate_var, &gate_path),
    ]);
    f.wait_runtimes(2);
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..12 {
        let (addr, tx) = (f.addr(), tx.clone());
        std::thread::spawn(move || {
            let _ = tx.send(Conn::open(addr).send("GET", "/gate", &[], Body::None));
        });
    }
    let refused: Vec<_> = (0..7)
        .map(|_| rx.recv_timeout(Duration::from_secs(60)).expect("a refusal"))
        .collect();
    for r in &refused {
        assert_eq!(
            (r.status, r.header("retry-after")),
            (503, Some("1")),
            "{}",
            r.text()
        );
        assert_eq!(r.body, br#"{"error":"overloaded"}"#);
    }
    gate.open();
    for _ in 0..5 {
        let r = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("an answer");
        assert_eq!((r.status, r.text().as_str()), (200, "through the gate"));
    }
}

#[test]
fn queue_messages_arrive_as_sqs_records_and_batch_item_failures_are_not_acknowledged() {
    let f = app(&[("RUNR_TRIGGER", "queue"), ("RUNR_REGION", "eu-west-1")]);
    let headers = |id: &'static str| {
        vec![
            ("ce-specversion", "1.0"),
            ("ce-id", id),
            ("ce-type", "dev.runr.queue.message"),
            ("ce-source", "/redisstream/orders/orders-api"),
            ("ce-time", "2026-10-10T12:00:00Z"),
            ("content-type", "application/json"),
            ("x-runr-delivery-attempt", "2"),
        ]
    };
    let r = f.send("POST", "/", &headers("1728561234567-0"), br#"{"item": 42}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let got = r.json();
    assert_eq!(got["messageId"], "1728561234567-0");
    assert_eq!(got["body"], json!({"item": 42}));
    assert_eq!(got["receiveCount"], "2");
    assert_eq!(got["sentTimestamp"], "1791633600000");
    assert_eq!(got["eventSource"], "runr:queue");
    assert_eq!(got["eventSourceArn"], "/redisstream/orders/orders-api");
    assert_eq!(got["awsRegion"], "eu-west-1");
    let md5 = Command::new("sh")
        .args([
            "-c",
            "printf '%s' '{\"item\": 42}' | md5sum | cut -d' ' -f1",
        ])
        .output()
        .unwrap();
    assert_eq!(
        got["md5OfBody"],
        String::from_utf8_lossy(&md5.stdout).trim()
    );
    let r = f.send(
        "POST",
        "/",
        &headers("1728561234567-1"),
        br#"{"fail": true}"#,
    );
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(
        r.error(),
        "the function reported message 1728561234567-1 as failed"
    );
}

#[test]
fn without_runr_trigger_each_requests_cloud_event_picks_the_event_shape() {
    let f = app(&[("RUNR_WORKERS", "2")]);
    let addr = f.addr();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                for n in 0..6 {
                    let id = format!("{t}-{n}");
                    let ce = |kind: &'static str, source: &'static str| {
                        vec![
                            ("ce-specversion", "1.0".to_string()),
                            ("ce-type", kind.to_string()),
                            ("ce-source", source.to_string()),
                            ("ce-id", id.clone()),
                            ("ce-time", "2026-10-10T12:00:00Z".to_string()),
                            ("content-type", "application/json".to_string()),
                        ]
                    };
                    let (headers, body) = match n % 3 {
                        0 => (
                            ce("dev.runr.queue.message", "/redisstream/orders/orders-api"),
                            format!(r#"{{"item": "{id}"}}"#),
                        ),
                        1 => (
                            ce("dev.runr.schedule.tick", "/runr/schedule"),
                            r#"{"trigger":"schedule"}"#.to_string(),
                        ),
                        _ => (ce("com.example.order", "/shop"), "plain".to_string()),
                    };
                    let h: Vec<(&str, &str)> =
                        headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    let r = c.send("POST", "/orders", &h, Body::Sized(body.as_bytes()));
                    assert_eq!(r.status, 200, "{}", r.text());
                    let got = r.json();
                    match n % 3 {
                        // An SQS record.
                        0 => {
                            assert_eq!(got["messageId"], id.as_str(), "{got}");
                            assert_eq!(got["body"], json!({"item": id}));
                            assert_eq!(got["eventSource"], "runr:queue");
                        }
                        // An EventBridge Scheduled Event.
                        1 => {
                            assert_eq!(got["id"], id.as_str(), "{got}");
                            assert_eq!(got["detailType"], "Scheduled Event");
                        }
                        // API Gateway HTTP API 2.0.
                        _ => {
                            assert_eq!(got["rawPath"], "/orders", "{got}");
                            assert_eq!(got["body"], "plain");
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }

    // A pod with RUNR_TRIGGER=http: a forged queue event is an HTTP request like any other.
    let f = app(&[("RUNR_TRIGGER", "http")]);
    let r = f.send(
        "POST",
        "/orders",
        &[
            ("ce-specversion", "1.0"),
            ("ce-type", "dev.runr.queue.message"),
            ("ce-id", "forged"),
        ],
        br#"{"item": 1}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["rawPath"], "/orders");
}

#[test]
fn concurrent_queue_messages_each_get_their_own_answer() {
    let f = app(&[("RUNR_TRIGGER", "queue"), ("RUNR_WORKERS", "3")]);
    let addr = f.addr();
    let handles: Vec<_> = (0..12)
        .map(|t| {
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                for i in 0..5 {
                    let id = format!("1728561234567-{t}-{i}");
                    let fail = (t + i) % 4 == 0;
                    let body = json!({"item": t * 100 + i, "fail": fail}).to_string();
                    let headers = [
                        ("ce-specversion", "1.0"),
                        ("ce-id", id.as_str()),
                        ("ce-type", "dev.runr.queue.message"),
                        ("ce-source", "/redisstream/orders/orders-api"),
                        ("content-type", "application/json"),
                    ];
                    let r = conn.send("POST", "/", &headers, Body::Sized(body.as_bytes()));
                    if fail {
                        assert_eq!(r.status, 500, "{}", r.text());
                        assert_eq!(
                            r.error(),
                            format!("the function reported message {id} as failed")
                        );
                    } else {
                        assert_eq!(r.status, 200, "{}", r.text());
                        let got = r.json();
                        assert_eq!(got["messageId"], id.as_str());
                        assert_eq!(got["body"]["item"], t * 100 + i);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn the_schedule_one_shot_sends_an_eventbridge_scheduled_event() {
    require_python("aws_lambda_powertools");
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("app.py"), fixture("app.py")).unwrap();
    let mut cmd = Command::new(bin());
    cmd.current_dir(root.path())
        .env("RUNR_WRAPPER_MODE", "lambda")
        .env("RUNR_TRIGGER", "schedule")
        .env("RUNR_COMMAND", awslambdaric("app.handler"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let run = finish(Child::spawn(&mut cmd).unwrap(), Duration::from_secs(60));
    assert_eq!(run.code, 0, "{}", run.stderr);
    let got: Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(got["source"], "aws.events");
    assert_eq!(got["detailType"], "Scheduled Event");
    assert_eq!(got["version"], "0");
    assert_eq!(got["account"], "000000000000");
    assert_eq!(got["region"], "runr");
    assert_eq!(got["resources"], json!([]));
    assert_eq!(got["detail"], json!({}));
    assert_eq!(got["id"].as_str().unwrap().len(), 36);
    assert!(got["time"].as_str().unwrap().ends_with('Z'));
    // The runtime was stopped with the one-shot.
    assert!(
        run.stderr.contains("runtime stopped slot=0"),
        "{}",
        run.stderr
    );

    // A function that fails: exit 1.
    std::fs::write(
        root.path().join("app.py"),
        "def handler(event, context):\n    raise ValueError('no')\n",
    )
    .unwrap();
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let run = finish(Child::spawn(&mut cmd).unwrap(), Duration::from_secs(60));
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stdout.contains("\"errorType\":\"ValueError\""),
        "{}",
        run.stdout
    );
}

#[test]
fn the_emulator_invoke_api_takes_raw_events_when_enabled() {
    let f = app(&[("RUNR_LAMBDA_INVOKE_API", "1")]);
    let path = "/2015-03-31/functions/function/invocations";
    let r = f.post(path, br#"{"hello": "world"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["echo"], json!({"hello": "world"}));
    let r = f.post(path, br#"{"fail": "missing"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-amz-function-error"), Some("Unhandled"));
    assert_eq!(r.json()["errorType"], "KeyError");
    // Ordinary requests are still API Gateway events.
    let r = f.get("/other");
    assert_eq!(r.json()["rawPath"], "/other");

    // Off (the default): the same path is just a path.
    let f = app(&[]);
    let r = f.post(path, br#"{"hello": "world"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["rawPath"], path);
}

#[test]
fn with_tracing_the_runtime_gets_an_xray_trace_id_under_the_wrappers_span() {
    let f = app(&[("RUNR_TRACING", "1")]);
    let r = f.send(
        "GET",
        "/traced",
        &[(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let xray = r.json()["env"]["_X_AMZN_TRACE_ID"]
        .as_str()
        .unwrap()
        .to_string();
    f.wait_log("GET /traced 200");
    let line = access_lines(&f.log())
        .into_iter()
        .find(|a| a.path == "/traced")
        .unwrap();
    assert_eq!(line.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(
        xray,
        format!(
            "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent={};Sampled=1",
            line.span_id
        )
    );
}

#[test]
fn failed_invocations_are_captured_for_replay() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("replay.jsonl");
    let f = app(&[
        ("RUNR_REPLAY", "1"),
        ("RUNR_REPLAY_FILE", file.to_str().unwrap()),
    ]);
    assert_eq!(f.get("/fine").status, 200);
    let r = f.send(
        "POST",
        "/error?why=replayed",
        &[("Authorization", "Bearer s3cret")],
        b"the body",
    );
    assert_eq!(r.status, 502);
    assert_eq!(f.get("/exit").status, 502);
    let lines = replay_lines(&file, 2);
    assert_eq!(lines.len(), 2, "only the failures: {lines:?}");
    let e = &lines[0];
    assert_eq!(
        (&e["method"], &e["path"], &e["query"]),
        (&json!("POST"), &json!("/error"), &json!("why=replayed"))
    );
    assert_eq!(
        (&e["body"], &e["status"], &e["failure"]),
        (&json!("the body"), &json!(502), &json!("status"))
    );
    assert_eq!(e["headers"]["authorization"], "[redacted]");
    assert_eq!(
        (&lines[1]["path"], &lines[1]["failure"]),
        (&json!("/exit"), &json!("crash"))
    );
}

#[test]
fn sigterm_drains_invocations_in_flight_then_stops_the_runtimes() {
    let marks = tempfile::tempdir().unwrap();
    let mut f = app(&[("RUNR_WORKERS", "3")]);
    let addr = f.addr();
    let path = format!("/sleep?s=1&mark={}", marks.path().display());
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || Conn::open(addr).send("GET", &path, &[], Body::None))
        })
        .collect();
    wait_for("three invocations running", Duration::from_secs(60), || {
        (std::fs::read_dir(marks.path()).unwrap().count() == 3).then_some(())
    });
    let runtimes = crate::support::children_of(f.pid() as i32);
    f.child.signal(Signal::SIGTERM);
    for c in clients {
        let r = c.join().unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "slept"));
    }
    let status = f.child.wait_timeout(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{}", f.log());
    assert_eq!(f.log().matches("runtime stopped").count(), 3, "{}", f.log());
    for (pid, _) in runtimes {
        assert!(!alive(pid), "runtime {pid} still running");
    }
}

#[test]
fn an_asgi_app_through_mangum() {
    require_python("mangum");
    let command = awslambdaric("asgi_app.handler");
    let f = Function::start(
        &[("asgi_app.py", &fixture("asgi_app.py"))],
        &[("RUNR_COMMAND", &command)],
    );
    let r = f.send(
        "GET",
        "/items/42?q=a+b&q=c",
        &[("Cookie", "a=1; b=2"), ("Host", "shop.example")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-app"), Some("asgi"));
    assert_eq!(
        r.headers_named("set-cookie"),
        ["session=abc; HttpOnly", "theme=dark"]
    );
    assert_eq!(
        r.json(),
        json!({"method": "GET", "path": "/items/42", "query": "q=a+b&q=c", "cookie": "a=1; b=2", "host": "shop.example", "body": ""})
    );
    let r = f.send("POST", "/multi/status", &[], b"text body");
    assert_eq!(r.status, 207);
    assert_eq!(r.json()["body"], "text body");
    // Binary both ways: mangum answers base64, the client gets the bytes.
    let body: Vec<u8> = (0..=255u8).rev().chain(0..=255u8).collect();
    let r = f.post("/binary", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    let expected: Vec<u8> = (0..=255u8).chain(body.iter().rev().copied()).collect();
    assert!(r.body == expected, "binary answer differs");
}
