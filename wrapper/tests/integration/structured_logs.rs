//! Structured logs: RUNR_LOG_FORMAT=json (every line one object; handler lines tied to the
//! right request id under concurrency, idle lines to none), RUNR_LOG_INVOCATIONS=1 (peak RSS
//! from wait4 in exec mode), RUNR_LOG_MAX_BYTES (unset: every line streamed; set: a prefix
//! kept, the rest counted and drained).

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use runr_testkit::wait_for;
use serde_json::Value;

use crate::support::telemetry::{json_lines, vars};
use crate::support::{bin, env, Body, Conn, Wrapper};

/// Sends `threads` × `per` requests at once, each with its own `X-Request-Id`, checking each
/// answer with `check`; returns the ids sent.
fn concurrent(
    w: &Wrapper,
    threads: usize,
    per: usize,
    check: fn(&str, &crate::support::Resp),
) -> Vec<String> {
    let addr = w.addr();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                (0..per)
                    .map(|i| {
                        let id = format!("req-{t}-{i}");
                        let r = c.send("POST", "/", &[("X-Request-Id", &id)], Body::Sized(b"x"));
                        check(&id, &r);
                        id
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
}

/// The handler lines of `lines` whose msg names a request (`... of <id>`), by that id: each
/// line's own requestId must be that id.
fn by_named_request(lines: &[Value]) -> HashMap<String, Vec<Value>> {
    let mut out: HashMap<String, Vec<Value>> = HashMap::new();
    for l in lines.iter().filter(|l| l["source"] == "handler") {
        let msg = l["msg"].as_str().unwrap();
        if let Some((_, id)) = msg.rsplit_once(" of ") {
            assert_eq!(
                l["requestId"], id,
                "a line of {id} tied to another request: {l}"
            );
            out.entry(id.to_string()).or_default().push(l.clone());
        }
    }
    out
}

#[test]
fn exec_json_logs_every_line_an_object_handler_lines_tied_to_their_request() {
    let script = r#"cat >/dev/null
echo "first of $RUNR_REQUEST_ID" >&2
sleep 0.0$((RANDOM % 5))
printf 'second of %s\n' "$RUNR_REQUEST_ID" >&2
printf 'done %s' "$RUNR_REQUEST_ID""#;
    let mut v = env("exec", &["bash", "-c", script]);
    v.extend(vars(&[
        ("RUNR_LOG_FORMAT", "json"),
        ("RUNR_TRACING", "1"),
        ("RUNR_LOG_INVOCATIONS", "1"),
    ]));
    let w = Wrapper::start(&v);
    let ids = concurrent(&w, 8, 10, |id, r| {
        assert_eq!((r.status, r.text()), (200, format!("done {id}")));
    });
    let log = wait_for("every invocation line", Duration::from_secs(20), || {
        let log = w.log();
        (log.matches("\"msg\":\"invocation\"").count() == ids.len()).then_some(log)
    });
    let lines = json_lines(&log);
    for l in &lines {
        assert!(l["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{l}");
        assert!(l["level"].is_string() && l["msg"].is_string(), "{l}");
    }
    let named = by_named_request(&lines);
    for id in &ids {
        let got: Vec<&str> = named[id]
            .iter()
            .map(|l| l["msg"].as_str().unwrap())
            .collect();
        assert_eq!(
            got,
            [format!("first of {id}"), format!("second of {id}")],
            "{id}"
        );
        for l in &named[id] {
            assert_eq!(
                (l["stream"].as_str(), l["level"].as_str()),
                (Some("stderr"), Some("info"))
            );
            // With tracing on, the trace too: the same one as the access line's.
            let trace = l["traceId"].as_str().unwrap();
            assert_eq!(trace.len(), 32);
        }
    }
    // The access line: an object with the text line's fields.
    let access: Vec<&Value> = lines.iter().filter(|l| l["msg"] == "access").collect();
    assert_eq!(access.len(), ids.len());
    for a in &access {
        assert_eq!(a["source"], "runr-wrapper");
        assert_eq!(
            (a["method"].as_str(), a["path"].as_str()),
            (Some("POST"), Some("/"))
        );
        assert_eq!(a["status"], 200);
        assert!(
            a["duration_ms"].is_f64() && a["sampled"].is_boolean() && a["cold_start"].is_boolean()
        );
        assert_eq!(a["span_id"].as_str().unwrap().len(), 16);
        let trace = a["trace_id"].as_str().unwrap();
        assert!(lines
            .iter()
            .any(|l| l["source"] == "handler" && l["traceId"] == trace));
    }
    // The per-invocation line, typed.
    let inv: Vec<&Value> = lines.iter().filter(|l| l["msg"] == "invocation").collect();
    for i in &inv {
        assert_eq!(i["trigger"], "http");
        assert_eq!(i["status"], 200);
        assert_eq!(i["exit_status"], 0);
        assert!(i["duration_ms"].as_f64().unwrap() > 0.0);
        assert!(i["peak_rss_kib"].as_u64().unwrap() > 0);
        assert!(i.get("error").is_none(), "{i}");
        assert!(ids.contains(&i["request_id"].as_str().unwrap().to_string()));
    }
    // The wrapper's own lines are objects too, the listening line among them.
    assert!(lines
        .iter()
        .any(|l| l["msg"] == "listening" && l["source"] == "runr-wrapper"));
}

#[test]
fn persistent_json_logs_tie_stderr_and_stdout_lines_to_the_request_being_served() {
    let script = r#"import json, os, sys, time, random
print("booting", file=sys.stderr, flush=True)
print("idle stdout line", flush=True)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    rid = req["id"]
    for k in range(3):
        print(f"line {k} of {rid}", file=sys.stderr, flush=True)
        time.sleep(random.random() / 500)
    print(f"stray stdout of {rid}", flush=True)
    print(json.dumps({"statusCode": 200, "body": "done " + rid}), flush=True)
    # Written after the answer: read before the next request or while idle, never tied to it.
    print(f"after answer {rid}", file=sys.stderr, flush=True)
"#;
    let mut v = env("persistent", &["python3", "-u", "-c", script]);
    // Ready handshake: "booting" is written before the worker can have a request (without it,
    // a request queued at start is written at once, and a line the worker prints while
    // starting is read during that invocation: by the rule, it is that invocation's).
    v.extend(vars(&[
        ("RUNR_LOG_FORMAT", "json"),
        ("RUNR_WORKERS", "4"),
        ("RUNR_WORKER_READY", "1"),
    ]));
    let w = Wrapper::start(&v);
    let ids = concurrent(&w, 8, 25, |id, r| {
        assert_eq!((r.status, r.text()), (200, format!("done {id}")));
    });
    let log = wait_for("every request's lines", Duration::from_secs(20), || {
        let log = w.log();
        // (The listening line names the command, whose text has the words too.)
        (log.matches("\"msg\":\"after answer ").count() == ids.len()).then_some(log)
    });
    let lines = json_lines(&log);
    let named = by_named_request(&lines);
    for id in &ids {
        let got = &named[id];
        let stderr = got.iter().filter(|l| l["stream"] == "stderr").count();
        let stdout = got.iter().filter(|l| l["stream"] == "stdout").count();
        assert_eq!((stderr, stdout), (3, 1), "{id}: {got:?}");
    }
    // Lines read while a worker was idle carry no request id.
    for l in lines.iter().filter(|l| l["source"] == "handler") {
        let msg = l["msg"].as_str().unwrap();
        if msg == "booting" || msg == "idle stdout line" {
            assert!(l.get("requestId").is_none(), "{l}");
        }
        // ("after answer ..." is written after the answer: it carries whichever invocation
        // the wrapper was in when it read it, maybe the worker's next one, by the rule.)
    }
    assert_eq!(
        lines.iter().filter(|l| l["msg"] == "booting").count(),
        4,
        "one per worker"
    );
}

#[test]
fn invocation_lines_in_text_with_peak_rss_exit_status_and_error() {
    let script = r#"import os, sys
sys.stdin.read()
if os.environ["RUNR_PATH"] == "/fail":
    sys.exit(3)
block = bytearray(64 * 1024 * 1024)
for i in range(0, len(block), 4096):
    block[i] = 1
print("ok")
"#;
    let mut v = env("exec", &["python3", "-c", script]);
    v.extend(vars(&[("RUNR_LOG_INVOCATIONS", "1")]));
    let w = Wrapper::start(&v);
    let r = w.send("GET", "/big", &[("X-Request-Id", "rss-1")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = w.send("GET", "/fail", &[("X-Request-Id", "fail-1")], b"");
    assert_eq!(r.status, 500);
    w.wait_log("request_id=fail-1");
    let log = w.log();
    let line = |id: &str| {
        log.lines()
            .find(|l| l.contains(&format!("invocation request_id={id} ")))
            .unwrap_or_else(|| panic!("no invocation line for {id}:\n{log}"))
            .to_string()
    };
    let big = line("rss-1");
    assert!(
        big.starts_with(
            "[runr-wrapper] invocation request_id=rss-1 trigger=http status=200 duration_ms="
        ),
        "{big}"
    );
    assert!(big.contains(" exit_status=0 "), "{big}");
    let rss: u64 = big.rsplit_once("peak_rss_kib=").unwrap().1.parse().unwrap();
    // 64 MiB touched, page by page: the handler's own peak, not the wrapper's.
    assert!((64 * 1024..1024 * 1024).contains(&rss), "{big}");
    let fail = line("fail-1");
    assert!(
        fail.contains(" status=500 ") && fail.contains(" error=crash exit_status=3 "),
        "{fail}"
    );
    let fail_rss: u64 = fail
        .rsplit_once("peak_rss_kib=")
        .unwrap()
        .1
        .parse()
        .unwrap();
    assert!(fail_rss < rss / 2, "{fail}");
}

#[test]
fn the_per_invocation_cap_keeps_a_prefix_says_what_was_dropped_and_never_blocks() {
    // 30 lines of 100 bytes, then 8 MiB more on stderr: far past a pipe's capacity.
    let script = r#"cat >/dev/null
for i in $(seq -w 1 30); do printf 'line %s of %s %s\n' "$i" "$RUNR_REQUEST_ID" "$(head -c $((87 - ${#RUNR_REQUEST_ID})) /dev/zero | tr '\0' x)" >&2; done
[ "$RUNR_PATH" = /flood ] && head -c 8388608 /dev/zero | tr '\0' y >&2
printf answered"#;
    let mut v = env("exec", &["bash", "-c", script]);
    v.extend(vars(&[
        ("RUNR_LOG_MAX_BYTES", "1KiB"),
        ("RUNR_TIMEOUT", "60"),
    ]));
    let w = Wrapper::start(&v);
    let r = w.send("POST", "/", &[("X-Request-Id", "cap-1")], b"x");
    assert_eq!((r.status, r.text().as_str()), (200, "answered"));
    let r = w.send("POST", "/flood", &[("X-Request-Id", "cap-2")], b"x");
    assert_eq!((r.status, r.text().as_str()), (200, "answered"));
    w.wait_log("request_id=cap-2 dropped_bytes=");
    let log = w.log();
    for id in ["cap-1", "cap-2"] {
        let kept: Vec<&str> = log
            .lines()
            .filter(|l| l.starts_with("line ") && l.contains(&format!(" of {id} ")))
            .collect();
        // Each line is 100 bytes: ten fit in 1024.
        assert_eq!(kept.len(), 10, "{id}:\n{log}");
        assert!(kept.iter().all(|l| l.len() == 99), "{kept:?}");
        assert!(kept[9].starts_with("line 10 "), "{kept:?}");
    }
    let dropped = |id: &str| -> u64 {
        let l = log
            .lines()
            .find(|l| l.contains("RUNR_LOG_MAX_BYTES") && l.contains(&format!("request_id={id} ")))
            .unwrap_or_else(|| panic!("no summary for {id}:\n{log}"));
        assert!(l.starts_with("[runr-wrapper] WARN "), "{l}");
        assert!(l.ends_with(" max_bytes=1024"), "{l}");
        l.split_once("dropped_bytes=")
            .unwrap()
            .1
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(dropped("cap-1"), 2000);
    assert_eq!(dropped("cap-2"), 2000 + 8 * 1024 * 1024);
    assert!(!log.contains("yyyy"), "the flood was not logged");
}

/// The lines `chatty line <n> of <id> ...` of `log`, in the order written, as their numbers.
fn chatty_lines(log: &str, id: &str) -> Vec<u32> {
    let tail = format!(" of {id} {}", "x".repeat(32));
    log.lines()
        .filter_map(|l| {
            l.strip_prefix("chatty line ")?
                .strip_suffix(&tail)?
                .parse()
                .ok()
        })
        .collect()
}

/// 40,000 lines of a chatty handler (2.2 MiB, past the old 1 MiB default cap), in exec and
/// persistent mode without RUNR_LOG_MAX_BYTES: every one arrives, once, in order.
#[test]
fn every_line_of_a_chatty_handler_arrives_without_a_cap() {
    const LINES: u32 = 40_000;
    let exec = format!(
        r#"cat >/dev/null; seq -f "chatty line %g of $RUNR_REQUEST_ID {}" 1 {LINES} >&2; printf done"#,
        "x".repeat(32)
    );
    let persistent = format!(
        r#"import json, sys
for line in sys.stdin:
    rid = json.loads(line)["id"]
    for i in range(1, {LINES} + 1):
        print(f"chatty line {{i}} of {{rid}} {}", file=sys.stderr)
    sys.stderr.flush()
    print(json.dumps("done"), flush=True)
"#,
        "x".repeat(32)
    );
    for (mode, command) in [
        ("exec", vec!["bash", "-c", exec.as_str()]),
        (
            "persistent",
            vec!["python3", "-u", "-c", persistent.as_str()],
        ),
    ] {
        let w = Wrapper::start(&env(mode, &command));
        let id = format!("chatty-{mode}");
        let r = w.send("POST", "/", &[("X-Request-Id", &id)], b"x");
        assert_eq!((r.status, r.text().as_str()), (200, "done"), "{mode}");
        let got = wait_for(
            &format!("{LINES} lines in {mode} mode"),
            Duration::from_secs(120),
            || {
                let got = chatty_lines(&w.log(), &id);
                (got.len() >= LINES as usize).then_some(got)
            },
        );
        assert_eq!(got, (1..=LINES).collect::<Vec<_>>(), "{mode}");
        assert!(
            !w.log().contains("RUNR_LOG_MAX_BYTES"),
            "{mode}: {}",
            w.log()
        );
    }
}

#[test]
fn the_cap_counts_per_invocation_in_persistent_mode() {
    let script = r#"import json, sys
for line in sys.stdin:
    rid = json.loads(line)["id"]
    for i in range(30):
        print(f"line {i:02} of {rid} " + "x" * (87 - len(rid)), file=sys.stderr, flush=True)
    print(json.dumps("ok"), flush=True)
"#;
    let mut v = env("persistent", &["python3", "-u", "-c", script]);
    v.extend(vars(&[("RUNR_LOG_MAX_BYTES", "1024")]));
    let w = Wrapper::start(&v);
    for id in ["p-1", "p-2"] {
        let r = w.send("POST", "/", &[("X-Request-Id", id)], b"x");
        assert_eq!((r.status, r.text().as_str()), (200, "ok"));
    }
    w.wait_log("request_id=p-2 dropped_bytes=2000");
    let log = w.log();
    for id in ["p-1", "p-2"] {
        let kept = log
            .lines()
            .filter(|l| l.starts_with("line ") && l.contains(&format!(" of {id} ")))
            .count();
        assert_eq!(kept, 10, "{id}:\n{log}");
    }
    assert!(log.contains("request_id=p-1 dropped_bytes=2000"), "{log}");
}

#[test]
fn bad_values_of_the_new_variables_exit_2_naming_each_and_json_errors_are_json() {
    let run = |extra: &[(&str, &str)]| {
        let mut cmd = Command::new(bin());
        cmd.env_clear()
            .env("RUNR_WRAPPER_MODE", "persistent")
            .env("RUNR_COMMAND", "cat");
        for (k, val) in extra {
            cmd.env(k, val);
        }
        cmd.output().unwrap()
    };
    let bad = [
        ("RUNR_KILL_GRACE", "soon"),
        ("RUNR_RESULT_FD", "4"),
        ("RUNR_WORKER_READY", "maybe"),
        ("RUNR_WORKER_MAX_REQUESTS", "0"),
        ("RUNR_WORKER_MAX_AGE", "1ms"),
        ("RUNR_METRICS_PORT", "http"),
        ("RUNR_LOG_INVOCATIONS", "often"),
        ("RUNR_LOG_MAX_BYTES", "lots"),
    ];
    let out = run(&[&bad[..], &[("RUNR_LOG_FORMAT", "xml")]].concat());
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), bad.len() + 1, "{err}");
    // Each a logfmt line whose message (quoted: it holds `=` and `"`) names the variable.
    let messages: Vec<String> = err
        .lines()
        .map(|l| {
            let pairs = runr_testkit::logfmt::parse(l).unwrap_or_else(|e| panic!("{e}"));
            runr_testkit::logfmt::values(&pairs, "msg")[0].to_string()
        })
        .collect();
    for (name, value) in bad.iter().chain([&("RUNR_LOG_FORMAT", "xml")]) {
        let needle = format!("invalid configuration: {name}={value:?}");
        assert_eq!(
            messages.iter().filter(|m| m.starts_with(&needle)).count(),
            1,
            "{needle}:\n{err}"
        );
    }
    assert!(
        err.lines().all(|l| l.starts_with("[runr-wrapper] ERROR ")),
        "{err}"
    );
    // With a good RUNR_LOG_FORMAT=json, the error lines are JSON objects too.
    let out = run(&[&bad[..], &[("RUNR_LOG_FORMAT", "json")]].concat());
    assert_eq!(out.status.code(), Some(2));
    let lines = json_lines(&String::from_utf8_lossy(&out.stderr));
    assert_eq!(lines.len(), bad.len());
    assert!(lines.iter().all(|l| l["level"] == "error"));
    assert!(lines[0]["msg"]
        .as_str()
        .unwrap()
        .contains("RUNR_KILL_GRACE=\"soon\""));
}

#[test]
fn text_mode_writes_plain_and_json_handler_lines_as_they_are_and_any_other_as_one_msg() {
    let w = Wrapper::start(&env(
        "exec",
        &[
            "bash",
            "-c",
            "cat >/dev/null; echo '{\"level\":\"warn\",\"m\":1}' >&2; echo plain >&2; \
             echo 'got a=b \"c\"' >&2; printf ok",
        ],
    ));
    assert_eq!(w.get("/").text(), "ok");
    w.wait_log("\nmsg=\"got a=b \\\"c\\\"\"\n");
    let log = w.log();
    assert!(log.contains("\nplain\n"), "{log}");
    assert!(log.contains("\n{\"level\":\"warn\",\"m\":1}\n"), "{log}");
}
