//! The trigger decision: `RUNR_TRIGGER` decides for the pod; unset, `RUNR_MODE=schedule` runs
//! the one-shot and otherwise each request's own binary-mode CloudEvent decides (queue for
//! runr-queue's type, schedule for the tick's, http for anything else) — in the envelope, exec
//! mode's variables, persistent workers, the metrics' label and the invocation line, under
//! concurrency. (Lambda mode's event shapes: `lambda::python`; the spec's Bash example fed by
//! the real runr-queue and runr-tick: the e2e crate's `triggers`.)

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::observed::run;
use crate::support::telemetry::{metrics_addr, scrape, vars};
use crate::support::{env, fixtures, Body, Conn, RespExt, Wrapper};

/// What runr-queue sends for one entry (`id`).
fn queue_event(id: &str) -> Vec<(&'static str, String)> {
    vec![
        ("ce-specversion", "1.0".into()),
        ("ce-type", "dev.runr.queue.message".into()),
        ("ce-source", "/redisstream/orders/orders-api".into()),
        ("ce-id", id.into()),
        ("ce-time", "2026-10-10T12:00:00Z".into()),
        ("Content-Type", "application/json".into()),
    ]
}

/// What runr-tick sends.
fn tick_event(id: &str) -> Vec<(&'static str, String)> {
    vec![
        ("ce-specversion", "1.0".into()),
        ("ce-type", "dev.runr.schedule.tick".into()),
        ("ce-source", "/runr/schedule".into()),
        ("ce-id", id.into()),
        ("ce-time", "2026-10-10T12:00:00Z".into()),
        ("Content-Type", "application/json".into()),
    ]
}

fn refs<'a>(h: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    h.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// One of the three kinds of request, the `n`th: its headers, body, and the trigger and event
/// the handler must see.
fn kind(
    n: usize,
    tag: &str,
) -> (
    Vec<(&'static str, String)>,
    &'static [u8],
    &'static str,
    Value,
) {
    let id = format!("{tag}-{n}");
    match n % 3 {
        0 => (
            queue_event(&id),
            br#"{"item":42}"#,
            "queue",
            json!({
                "specversion": "1.0", "type": "dev.runr.queue.message",
                "source": "/redisstream/orders/orders-api", "id": id,
                "time": "2026-10-10T12:00:00Z", "datacontenttype": "application/json",
                "data": {"item": 42},
            }),
        ),
        1 => (
            tick_event(&id),
            br#"{"trigger":"schedule"}"#,
            "schedule",
            json!({
                "specversion": "1.0", "type": "dev.runr.schedule.tick",
                "source": "/runr/schedule", "id": id,
                "time": "2026-10-10T12:00:00Z", "datacontenttype": "application/json",
                "data": {"trigger": "schedule"},
            }),
        ),
        // Someone else's CloudEvent is a plain HTTP request.
        _ => (
            vec![
                ("ce-specversion", "1.0".into()),
                ("ce-type", "com.example.order".into()),
                ("ce-id", id),
                ("X-Request-Id", format!("{tag}-{n}")),
            ],
            b"plain",
            "http",
            Value::Null,
        ),
    }
}

#[test]
fn without_runr_trigger_each_requests_cloud_event_decides_under_concurrency() {
    // JSON input: `cat` answers the envelope itself.
    let w = Wrapper::start(&env("exec", &["cat"]));
    let addr = w.addr();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                for n in 0..12 {
                    let (headers, body, trigger, event) = kind(t + n, &format!("c{t}"));
                    let r = c.send("POST", "/", &refs(&headers), Body::Sized(body));
                    assert_eq!(r.status, 200, "{}", r.text());
                    let e = r.json();
                    assert_eq!(e["trigger"], trigger, "{e}");
                    assert_eq!(e["id"], format!("c{t}-{}", t + n), "{e}");
                    assert_eq!(e["body"], *String::from_utf8_lossy(body), "{e}");
                    match event {
                        Value::Null => assert!(e.get("event").is_none(), "{e}"),
                        event => assert_eq!(e["event"], event, "{e}"),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn exec_variables_follow_the_request_unless_runr_trigger_says() {
    let f = fixtures();
    let script = f.path("env.py");
    let cmd = ["python3", script.as_str()];
    let per_request = Wrapper::start(&env("exec", &cmd));
    let v = per_request
        .send("POST", "/", &refs(&queue_event("7-0")), br#"{"a":1}"#)
        .json();
    assert_eq!(v["RUNR_TRIGGER"], "queue");
    assert_eq!(v["RUNR_EVENT_ID"], "7-0");
    assert_eq!(v["RUNR_EVENT_TYPE"], "dev.runr.queue.message");
    assert_eq!(v["RUNR_EVENT_SOURCE"], "/redisstream/orders/orders-api");
    let v = per_request
        .send("POST", "/", &refs(&tick_event("t-1")), b"{}")
        .json();
    assert_eq!(v["RUNR_TRIGGER"], "schedule");
    assert_eq!(v["RUNR_EVENT_TYPE"], "dev.runr.schedule.tick");
    let v = per_request.get("/plain").json();
    assert_eq!(v["RUNR_TRIGGER"], "http");
    assert!(v.get("RUNR_EVENT_TYPE").is_none(), "{v}");

    // An http-triggered pod: a client's forged CloudEvent is only headers.
    let mut http = env("exec", &cmd);
    http.extend(vars(&[("RUNR_TRIGGER", "http")]));
    let w = Wrapper::start(&http);
    let v = w
        .send("POST", "/", &refs(&queue_event("forged")), b"{}")
        .json();
    assert_eq!(v["RUNR_TRIGGER"], "http");
    assert!(v.get("RUNR_EVENT_ID").is_none(), "{v}");
    assert!(v.get("RUNR_EVENT_TYPE").is_none(), "{v}");
    assert_eq!(v["RUNR_HEADER_CE_TYPE"], "dev.runr.queue.message");
    // ... and so is the envelope's.
    let mut http = env("exec", &["cat"]);
    http.extend(vars(&[("RUNR_TRIGGER", "http")]));
    let w = Wrapper::start(&http);
    let e = w
        .send("POST", "/", &refs(&queue_event("forged")), b"{}")
        .json();
    assert_eq!(e["trigger"], "http");
    assert!(e.get("event").is_none(), "{e}");
    assert_ne!(e["id"], "forged");
}

#[test]
fn persistent_workers_see_the_requests_trigger() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("triggers.py");
    std::fs::write(
        &script,
        r#"import json, sys
for line in sys.stdin:
    req = json.loads(line)
    print(json.dumps({"trigger": req["trigger"], "event": req.get("event", {}).get("type")}), flush=True)
"#,
    )
    .unwrap();
    let script = script.display().to_string();
    let mut v = env("persistent", &["python3", "-u", &script]);
    v.extend(vars(&[("RUNR_WORKERS", "2")]));
    let w = Wrapper::start(&v);
    let addr = w.addr();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                for n in 0..9 {
                    let (headers, body, trigger, event) = kind(t + n, "p");
                    let r = c.send("POST", "/", &refs(&headers), Body::Sized(body));
                    assert_eq!(
                        r.json(),
                        json!({"trigger": trigger, "event": event.get("type")}),
                        "{}",
                        r.text()
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn metrics_and_the_invocation_line_carry_each_requests_trigger() {
    let mut v = env("exec", &["bash", "-c", "cat >/dev/null; printf ok"]);
    v.extend(vars(&[
        ("RUNR_METRICS_PORT", "0"),
        ("RUNR_LOG_INVOCATIONS", "1"),
    ]));
    let w = Wrapper::start(&v);
    for n in 0..6 {
        let (headers, body, _, _) = kind(n, "m");
        let r = w.send("POST", "/", &refs(&headers), body);
        assert_eq!((r.status, r.text().as_str()), (200, "ok"));
    }
    let s = scrape(metrics_addr(&w));
    for trigger in ["http", "queue", "schedule"] {
        assert_eq!(
            s.value(
                "faas_invocations_total",
                &[("trigger", trigger), ("code", "2xx")]
            ),
            2.0,
            "{trigger}: {}",
            s.text
        );
        assert_eq!(
            s.value(
                "faas_invoke_duration_seconds_count",
                &[("trigger", trigger)]
            ),
            2.0
        );
    }
    let log = w.log();
    for (id, trigger) in [("m-0", "queue"), ("m-1", "schedule"), ("m-2", "http")] {
        let line = runr_testkit::wait_for("the invocation line", Duration::from_secs(60), || {
            w.log()
                .lines()
                .find(|l| l.contains(&format!("invocation request_id={id} ")))
                .map(str::to_string)
        });
        assert!(
            line.contains(&format!(" trigger={trigger} ")),
            "{line}\n{log}"
        );
    }

    // A pod with a trigger shows only its own series until another one happens (never, here).
    let mut v = env("exec", &["bash", "-c", "cat >/dev/null; printf ok"]);
    v.extend(vars(&[
        ("RUNR_METRICS_PORT", "0"),
        ("RUNR_TRIGGER", "queue"),
    ]));
    let w = Wrapper::start(&v);
    let (headers, body, _, _) = kind(1, "tick");
    assert_eq!(w.send("POST", "/", &refs(&headers), body).status, 200);
    let s = scrape(metrics_addr(&w));
    let triggers: Vec<String> = s
        .series("faas_invocations_total")
        .into_iter()
        .map(|(labels, _)| labels["trigger"].clone())
        .collect();
    assert!(triggers.iter().all(|t| t == "queue"), "{}", s.text);
    assert_eq!(
        s.value(
            "faas_invocations_total",
            &[("trigger", "queue"), ("code", "2xx")]
        ),
        1.0
    );
}

#[test]
fn runr_mode_schedule_without_runr_trigger_runs_the_one_shot() {
    // Exec mode: one invocation with the tick, its answer on stdout, exit 0.
    let vars = [
        ("RUNR_WRAPPER_MODE", "exec".to_string()),
        ("RUNR_COMMAND", r#"["cat"]"#.to_string()),
        ("RUNR_MODE", "schedule".to_string()),
    ];
    let r = run(&[], &vars, Duration::from_secs(60));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let e: Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(e["trigger"], "schedule");
    assert_eq!(e["event"]["type"], "dev.runr.schedule.tick");
    assert!(!r.stderr.contains("unknown variable"), "{}", r.stderr);
    // Exit status as with RUNR_TRIGGER=schedule: 1 for a failing handler.
    let failing = [
        ("RUNR_WRAPPER_MODE", "exec".to_string()),
        (
            "RUNR_COMMAND",
            r#"["sh", "-c", "cat >/dev/null; exit 3"]"#.to_string(),
        ),
        ("RUNR_MODE", "schedule".to_string()),
    ];
    let r = run(&[], &failing, Duration::from_secs(60));
    assert_eq!(r.code, 1, "{}", r.stderr);

    // RUNR_TRIGGER wins over RUNR_MODE: this pod serves.
    let w = Wrapper::start(&[
        ("RUNR_WRAPPER_MODE".into(), "exec".into()),
        ("RUNR_COMMAND".into(), r#"["cat"]"#.into()),
        ("RUNR_MODE".into(), "schedule".into()),
        ("RUNR_TRIGGER".into(), "http".into()),
    ]);
    assert_eq!(w.get("/").json()["trigger"], "http");
}

#[test]
fn runr_mode_schedule_runs_the_invoke_sequence_in_http_mode() {
    use crate::support::observed::upstream_command;
    let port = runr_testkit::free_port();
    let vars = [
        ("PORT", port.to_string()),
        ("RUNR_WRAPPER_MODE", "http".to_string()),
        ("RUNR_COMMAND", upstream_command()),
        ("RUNR_MODE", "schedule".to_string()),
    ];
    let r = run(&[], &vars, Duration::from_secs(60));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let body: Value = serde_json::from_str(r.stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: {:?} {}", r.stdout, r.stderr));
    assert_eq!(body["ce_type"], "dev.runr.schedule.tick");
}
