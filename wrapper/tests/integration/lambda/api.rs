//! The Runtime API's corners, driven by a hand-written runtime (raw_runtime.py): unknown ids,
//! second answers, requests out of order, unsupported APIs, bad response modes, oversized and
//! cut-off bodies, plain-text errors, streams with error trailers and without a prelude; none
//! of it crashes or restarts the runtime. Also bad configuration, CORS and probes.

use std::process::Command;
use std::time::Duration;

use runr_testkit::wait_for;

use serde_json::{json, Value};

use super::fixture;
use super::support::{Function, Stream, PYTHON};
use crate::support::{bin, RespExt};

struct Raw {
    f: Function,
    results: std::path::PathBuf,
}

impl Raw {
    fn start() -> Raw {
        let results = tempfile::NamedTempFile::new()
            .unwrap()
            .into_temp_path()
            .keep()
            .unwrap();
        let command = serde_json::to_string(&[PYTHON, "raw_runtime.py"]).unwrap();
        let f = Function::start(
            &[("raw_runtime.py", &fixture("raw_runtime.py"))],
            &[
                ("RUNR_COMMAND", &command),
                ("RESULTS", results.to_str().unwrap()),
            ],
        );
        Raw { f, results }
    }

    /// The API's answer the runtime recorded for `step` (it records after its request
    /// ended, which can be after the client's answer: waited for).
    fn result(&self, step: &str) -> Value {
        wait_for(
            &format!("the runtime's record of {step:?}"),
            Duration::from_secs(30),
            || {
                let text = std::fs::read_to_string(&self.results).unwrap_or_default();
                text.lines()
                    .rev()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .find(|v| v["step"] == step)
            },
        )
    }

    fn pids(&self) -> Vec<i64> {
        let text = std::fs::read_to_string(&self.results).unwrap_or_default();
        let mut pids: Vec<i64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["pid"]
                    .as_i64()
                    .unwrap()
            })
            .collect();
        pids.dedup();
        pids
    }
}

fn api_error(v: &Value) -> (u64, String, String) {
    (
        v["status"].as_u64().unwrap(),
        v["body"]["errorType"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        v["body"]["errorMessage"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

#[test]
fn protocol_mistakes_get_the_documented_answers_and_never_restart_the_runtime() {
    let raw = Raw::start();
    let f = &raw.f;
    let r = f.get("/protocol");
    assert_eq!(r.status, 200, "{}", r.text());
    let seen: Value = serde_json::from_str(&r.text()).unwrap();
    let e = |k: &str| api_error(&seen[k]);
    assert_eq!(
        e("unknown id"),
        (400, "InvalidRequestID".into(), "Invalid request ID".into())
    );
    assert_eq!(e("error for unknown id").1, "InvalidRequestID");
    assert_eq!(
        e("init error when running"),
        (
            403,
            "InvalidStateTransition".into(),
            "State transition from Running to InitError failed for runtime. Error: State transition is not allowed".into()
        )
    );
    let (status, kind, message) = e("extension register");
    assert_eq!((status, kind.as_str()), (404, "NotSupported"));
    assert!(
        message.contains("Extensions API (/2020-01-01/extension)"),
        "{message}"
    );
    assert!(e("telemetry").2.contains("Telemetry API"));
    assert_eq!(e("wrong method").0, 405);
    assert_eq!(e("unknown path").0, 404);
    assert_eq!(seen["next again"], json!({"status": 200, "same": true}));

    // After the answer: a second answer or error for the same id, and a late init error.
    assert_eq!(raw.result("response")["status"], 202);
    assert_eq!(
        api_error(&raw.result("second response")),
        (
            403,
            "InvalidStateTransition".into(),
            "State transition from RuntimeResponseSentState to InvocationResponse failed for runtime. Error: State transition is not allowed".into()
        )
    );
    assert_eq!(
        api_error(&raw.result("error after response")).1,
        "InvalidStateTransition"
    );
    assert_eq!(api_error(&raw.result("init error after response")).0, 403);

    // Bad bodies: 4xx to the runtime, 502 to the client.
    let r = f.get("/bad-mode");
    assert_eq!(r.status, 502);
    assert_eq!(
        r.error(),
        "the runtime sent an invalid Lambda-Runtime-Function-Response-Mode"
    );
    assert_eq!(
        api_error(&raw.result("bad mode")),
        (
            400,
            "InvalidFunctionResponseMode".into(),
            "Invalid function response mode".into()
        )
    );
    let r = f.get("/too-large");
    assert_eq!(
        (r.status, r.error().as_str()),
        (502, "the function's response exceeds 6 MiB")
    );
    assert_eq!(
        api_error(&raw.result("too large")),
        (
            413,
            "RequestEntityTooLarge".into(),
            "Exceeded maximum allowed payload size (6291456 bytes).".into()
        )
    );
    let r = f.get("/just-fits");
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 6 * 1024 * 1024);
    let r = f.get("/truncated");
    assert_eq!(
        (r.status, r.error().as_str()),
        (502, "the function's response was cut off")
    );
    let r = f.get("/error-text");
    assert_eq!(r.status, 502);
    assert_eq!(
        r.json(),
        json!({"error": "plain words", "errorType": "Custom.Kind"})
    );
    assert_eq!(raw.result("error text")["status"], 202);
    let r = f.get("/error-json");
    assert_eq!(
        r.json(),
        json!({"error": "it broke", "errorType": "Broken"})
    );

    // All of it on the runtime's first process.
    let r = f.get("/still-there");
    assert_eq!(r.status, 200);
    assert_eq!(
        raw.pids().len(),
        1,
        "the runtime was restarted: {:?}",
        raw.pids()
    );
    assert_eq!(r.json()["pid"], raw.pids()[0]);
    assert_eq!(f.log().matches("runtime started").count(), 1, "{}", f.log());
}

#[test]
fn streams_from_a_custom_runtime_plain_and_with_error_trailers() {
    let raw = Raw::start();
    let f = &raw.f;
    let go = tempfile::tempdir().unwrap();

    // No prelude: 200 with the stream's own content type, chunks as they come.
    let mark = go.path().join("plain");
    let mut s = Stream::get(f.addr(), &format!("/stream-plain?go={}", mark.display()));
    assert_eq!(s.status, 200);
    assert_eq!(s.header("content-type"), ["text/event-stream"]);
    assert_eq!(s.read_exact(9), b"data: 1\n\n");
    std::fs::write(&mark, b"").unwrap();
    assert_eq!(s.read_exact(9), b"data: 2\n\n");
    assert_eq!(s.chunk(), Ok(None));
    assert_eq!(raw.result("stream plain")["status"], 202);

    // The prelude's head, a chunk, then error trailers: the answer is cut off, not completed.
    let mark = go.path().join("trailers");
    let mut s = Stream::get(f.addr(), &format!("/stream-trailers?go={}", mark.display()));
    assert_eq!(s.status, 200);
    assert_eq!(s.header("content-type"), ["text/plain"]);
    assert_eq!(s.read_exact(7), b"part 1\n");
    std::fs::write(&mark, b"").unwrap();
    assert!(
        s.chunk().is_err(),
        "the answer must end without its last chunk"
    );
    assert_eq!(raw.result("stream with error trailers")["status"], 202);
    f.wait_log("the function's streamed response ended with an error error_type=Runtime.StreamError error_message=\"stream broke\"");

    // An HTTP-integration stream that never sends its delimiter.
    let r = f.get("/stream-no-prelude");
    assert_eq!(r.status, 502);
    assert_eq!(r.error(), "the streamed response ended before its prelude");
    assert_eq!(raw.pids().len(), 1, "{:?}", raw.pids());
}

#[test]
fn cors_and_probes_as_in_the_other_modes() {
    let raw = Raw::start();
    let f = &raw.f;
    f.wait_runtimes(1);
    let r = f.send(
        "OPTIONS",
        "/anything",
        &[("Origin", "https://a.example")],
        b"",
    );
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("GET, POST, PUT, DELETE, PATCH, OPTIONS")
    );
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    for probe in ["K-Network-Probe", "K-Kubelet-Probe"] {
        let r = f.send("GET", "/", &[(probe, "queue")], b"");
        assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{probe}");
    }
    assert!(
        !f.log().contains("/response"),
        "preflights and probes must not invoke the function"
    );
    let r = f.get("/x");
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
}

#[test]
fn bad_lambda_configuration_exits_2_naming_every_variable() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .current_dir(dir.path())
        .env_clear()
        .env("RUNR_WRAPPER_MODE", "lambda")
        .env("RUNR_REGION", "eu west")
        .env("RUNR_LAMBDA_INVOKE_API", "maybe")
        .env("K_SERVICE", "bad name")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let read: Vec<String> = err.lines().map(runr_testkit::logfmt::plain).collect();
    let err = read.join("\n");
    for expected in [
        r#"RUNR_REGION="eu west""#,
        r#"RUNR_LAMBDA_INVOKE_API="maybe""#,
        r#"K_SERVICE="bad name""#,
    ] {
        assert_eq!(
            err.lines().filter(|l| l.contains(expected)).count(),
            1,
            "{expected}:\n{err}"
        );
    }
    let no_bootstrap = !std::path::Path::new("/opt/bootstrap").exists()
        && !std::path::Path::new("/var/runtime/bootstrap").exists();
    if no_bootstrap {
        assert!(
            err.contains("RUNR_COMMAND=<unset>: required in lambda mode unless one of"),
            "{err}"
        );
    }
    assert!(!err.contains("panicked"), "{err}");
}
