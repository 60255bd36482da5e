//! The result channel (RUNR_RESULT_FD=3): the answer on fd 3, stdout a log stream, in both
//! modes, with handlers that log JSON on stdout; answers of sizes around pipe and buffer
//! boundaries checked byte for byte under concurrency.

use std::time::Duration;

use runr_testkit::wait_for;

use crate::support::telemetry::{json_lines, vars};
use crate::support::{env, Body, Conn, RespExt, Wrapper};

/// Sizes that straddle pipe and buffer boundaries.
const SIZES: [usize; 10] = [
    0,
    1,
    4095,
    4096,
    4097,
    65535,
    65536,
    65537,
    200_000,
    1 << 20,
];

/// Exec handler: logs JSON on stdout (before and after), writes `?n=` bytes to fd 3.
const EXEC_HANDLER: &str = r#"import json, os, sys
req = json.load(sys.stdin)
n = int(req["query"].get("n", "0"))
print(json.dumps({"level": "info", "msg": "handling " + req["id"]}), flush=True)
out = os.fdopen(3, "wb")
out.write(bytes((i * 7 + n) % 251 for i in range(n)))
out.close()
print(json.dumps({"level": "info", "msg": "done " + req["id"]}), flush=True)
"#;

fn expected(n: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 7 + n) % 251) as u8).collect()
}

fn exec_fd3(extra: &[(&str, &str)]) -> Wrapper {
    let mut v = env("exec", &["python3", "-c", EXEC_HANDLER]);
    v.extend(vars(&[("RUNR_RESULT_FD", "3")]));
    v.extend(vars(extra));
    Wrapper::start(&v)
}

/// `threads` clients, each sending every size in turn with its own request id.
fn sizes_concurrently(w: &Wrapper, threads: usize) {
    let addr = w.addr();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                for (k, n) in SIZES.iter().enumerate() {
                    let id = format!("fd3-{t}-{k}");
                    let r = c.send(
                        "GET",
                        &format!("/?n={n}"),
                        &[("X-Request-Id", &id)],
                        Body::None,
                    );
                    assert_eq!(r.status, 200, "{id}: {}", r.text());
                    assert_eq!(r.body.len(), *n, "{id}");
                    assert!(r.body == expected(*n), "{id}: bytes differ");
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn exec_answers_from_fd3_and_logs_stdout_at_8_clients() {
    let w = exec_fd3(&[]);
    sizes_concurrently(&w, 8);
    // Every JSON line the handler printed on stdout is in the logs, none in an answer.
    w.wait_log("{\"level\": \"info\", \"msg\": \"done fd3-7-9\"}");
    let log = w.log();
    assert_eq!(
        log.matches("\"msg\": \"handling fd3-").count(),
        8 * SIZES.len()
    );
}

#[test]
fn exec_stdout_lines_are_handler_lines_of_the_invocation_in_json() {
    let w = exec_fd3(&[("RUNR_LOG_FORMAT", "json")]);
    let r = w.send("GET", "/?n=5", &[("X-Request-Id", "j-1")], b"");
    assert_eq!(r.body, expected(5));
    let log = wait_for("both stdout lines", Duration::from_secs(60), || {
        let log = w.log();
        log.contains("done j-1").then_some(log)
    });
    let lines: Vec<_> = json_lines(&log)
        .into_iter()
        .filter(|l| l["source"] == "handler")
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    for l in &lines {
        assert_eq!(
            (l["stream"].as_str(), l["requestId"].as_str()),
            (Some("stdout"), Some("j-1"))
        );
    }
    let inner: serde_json::Value = serde_json::from_str(lines[0]["msg"].as_str().unwrap()).unwrap();
    assert_eq!(inner["msg"], "handling j-1");
}

#[test]
fn exec_without_the_variable_the_handler_has_no_fd3_and_stdout_answers() {
    let probe = "if [ -e /proc/self/fd/3 ]; then printf 'fd3 %s' \"$(readlink /proc/self/fd/3)\"; else printf 'no fd3'; fi";
    let w = Wrapper::start(&env("exec", &["bash", "-c", probe]));
    assert_eq!(w.get("/").text(), "no fd3");
    let mut v = env("exec", &["bash", "-c", &format!("{probe} >&3")]);
    v.extend(vars(&[("RUNR_RESULT_FD", "3")]));
    let w = Wrapper::start(&v);
    let text = w.get("/").text();
    assert!(text.starts_with("fd3 pipe:["), "{text}");
}

#[test]
fn exec_fd3_answers_an_envelope_and_the_exit_status_rule_holds() {
    let script = r#"cat >/dev/null
echo '{"statusCode":418,"body":"on stdout: a log line"}'
case "$RUNR_PATH" in
  /teapot) printf '{"statusCode":201,"headers":{"X-A":"1"},"body":"made"}' >&3 ;;
  /fail) echo 'partial' >&3; exit 2 ;;
esac"#;
    let mut v = env("exec", &["bash", "-c", script]);
    v.extend(vars(&[("RUNR_RESULT_FD", "3")]));
    let w = Wrapper::start(&v);
    let r = w.get("/teapot");
    assert_eq!(
        (r.status, r.header("x-a"), r.text().as_str()),
        (201, Some("1"), "made")
    );
    let r = w.get("/fail");
    assert_eq!(
        (r.status, r.header("x-runr-error"), r.error().as_str()),
        (500, Some("crash"), "handler exited with status 2")
    );
    // Nothing on fd 3: an empty answer, whatever stdout held.
    let r = w.get("/none");
    assert_eq!((r.status, r.text().as_str()), (200, ""));
    assert!(w
        .log()
        .contains("{\"statusCode\":418,\"body\":\"on stdout: a log line\"}"));
}

/// Persistent worker: a JSON logger on stdout, the ready line and the answers on fd 3.
const WORKER: &str = r#"import json, os, sys
out = os.fdopen(3, "w")
print(json.dumps({"level": "info", "msg": "booting"}), flush=True)
out.write(json.dumps({"ready": True}) + "\n"); out.flush()
for line in sys.stdin:
    req = json.loads(line)
    n = int(req["query"].get("n", "0"))
    print(json.dumps({"statusCode": 500, "msg": "a JSON log line of " + req["id"]}), flush=True)
    body = "".join(chr(97 + (i * 7 + n) % 26) for i in range(n))
    out.write(json.dumps({"statusCode": 200, "body": body, "headers": {"X-Id": req["id"]}}) + "\n")
    out.flush()
"#;

#[test]
fn persistent_answers_on_fd3_and_stdout_json_goes_to_the_logs() {
    let mut v = env("persistent", &["python3", "-u", "-c", WORKER]);
    v.extend(vars(&[
        ("RUNR_RESULT_FD", "3"),
        ("RUNR_WORKER_READY", "1"),
        ("RUNR_WORKERS", "4"),
        ("RUNR_LOG_FORMAT", "json"),
    ]));
    let w = Wrapper::start(&v);
    let addr = w.addr();
    let hs: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                for (k, n) in SIZES.iter().enumerate() {
                    let id = format!("p-{t}-{k}");
                    let r = c.send(
                        "GET",
                        &format!("/?n={n}"),
                        &[("X-Request-Id", &id)],
                        Body::None,
                    );
                    assert_eq!(r.status, 200, "{id}: {}", r.text());
                    assert_eq!(r.header("x-id"), Some(id.as_str()));
                    let want: String = (0..*n)
                        .map(|i| (97 + ((i * 7 + n) % 26) as u8) as char)
                        .collect();
                    assert!(r.text() == want, "{id}: body differs");
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let log = wait_for("every stdout line", Duration::from_secs(20), || {
        let log = w.log();
        (log.matches("a JSON log line of p-").count() == 8 * SIZES.len()).then_some(log)
    });
    for l in json_lines(&log).iter().filter(|l| l["source"] == "handler") {
        assert_eq!(l["stream"], "stdout", "{l}");
        let msg = l["msg"].as_str().unwrap();
        if let Some((_, id)) = msg.split_once("a JSON log line of ") {
            let id = id.trim_end_matches("\"}");
            assert_eq!(l["requestId"], id, "{l}");
        }
    }
}
