//! Persistent mode against real workers (python3 and C): the line protocol, queueing, slots,
//! restarts with backoff, timeouts, limits.

use std::collections::HashSet;
use std::time::Duration;

use runr_testkit::wait_for;

use crate::support::{alive, env, fixtures, load, Body, RespExt, Wrapper};

fn python_worker(extra: &[(&str, &str)]) -> Wrapper {
    let f = fixtures();
    let mut vars = env("persistent", &["python3", "-u", &f.path("worker.py")]);
    vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Wrapper::start(&vars)
}

#[test]
fn json_lines_protocol_and_stray_lines_in_the_logs() {
    let w = python_worker(&[]);
    let r = w.post("/hello?x=1", b"payload");
    assert_eq!(r.status, 200, "{}", r.text());
    let b = r.json();
    assert_eq!(b["path"], "/hello");
    assert_eq!(b["body"], "payload");
    assert_eq!(b["worker"], "0");
    // Everything about the request is in the envelope, not in per-invocation variables.
    assert_eq!(b["exec_var"], serde_json::Value::Null);
    let pid = b["pid"].as_i64().unwrap();
    // The same process serves the next request.
    assert_eq!(w.get("/again").json()["pid"].as_i64().unwrap(), pid);
    // Non-JSON stdout lines went to the logs, unprefixed.
    w.wait_log("\ndebug: got /hello\n");
    assert!(w.log().contains("\nworker booting\n"), "{}", w.log());
    // A JSON string is sent as text.
    let r = w.get("/string");
    assert_eq!(
        (r.text().as_str(), r.header("content-type")),
        ("plain string", Some("text/plain; charset=utf-8"))
    );
}

#[test]
fn compiled_echo_worker() {
    let f = fixtures();
    let w = Wrapper::start(&env("persistent", &[&f.path("echo_worker")]));
    for i in 0..20 {
        let body = format!("message {i} with \"quotes\" and \\ backslash");
        let r = w.post("/", body.as_bytes());
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), body);
    }
}

#[test]
fn requests_queue_for_a_free_worker_and_every_slot_is_used() {
    let w = python_worker(&[("RUNR_WORKERS", "3")]);
    // Each request holds its worker for 0.3 s; 9 concurrent requests on 3 workers all finish.
    let handles: Vec<_> = (0..9)
        .map(|_| {
            let addr = w.addr();
            std::thread::spawn(move || {
                crate::support::Conn::open(addr).send("GET", "/sleep?s=0.3", &[], Body::None)
            })
        })
        .collect();
    let mut slots = HashSet::new();
    for h in handles {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        slots.insert(r.json()["worker"].as_str().unwrap().to_string());
    }
    assert_eq!(slots, HashSet::from(["0".into(), "1".into(), "2".into()]));
}

#[test]
fn an_exiting_worker_answers_502_and_is_restarted() {
    let w = python_worker(&[]);
    let pid = w.get("/").json()["pid"].as_i64().unwrap();
    let r = w.get("/exit");
    assert_eq!(r.status, 502);
    assert_eq!(r.error(), "handler process exited");
    // It had served a request: restarted after 100 ms, so the next request just works.
    let r = w.get("/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ne!(r.json()["pid"].as_i64().unwrap(), pid);
    assert!(!alive(pid as i32));
}

#[test]
fn a_crash_looping_worker_backs_off_doubling() {
    let f = fixtures();
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let mut vars = env("persistent", &["bash", &f.path("crash.sh")]);
    vars.push(("STARTS".into(), starts.display().to_string()));
    let w = Wrapper::start(&vars);
    let times = wait_for("six worker starts", Duration::from_secs(120), || {
        let text = std::fs::read_to_string(&starts).unwrap_or_default();
        let times: Vec<f64> = text.lines().filter_map(|l| l.parse().ok()).collect();
        (times.len() >= 6).then_some(times)
    });
    // The delays the wrapper chose, in order: doubling from 100 ms.
    let delays: Vec<u64> = w
        .log()
        .lines()
        .filter(|l| l.contains("restarting worker slot=0 "))
        .filter_map(|l| {
            l.split_once("delay_ms=")?
                .1
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .take(5)
        .collect();
    assert_eq!(delays, [100, 200, 400, 800, 1600], "{}", w.log());
    // And waited out: each start at least its delay after the one before.
    for (i, pair) in times.windows(2).take(5).enumerate() {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= delays[i] as f64 / 1000.0 * 0.99,
            "start {} came {gap:.3}s after the one before, its delay is {} ms",
            i + 1,
            delays[i]
        );
    }
}

#[test]
fn timeout_kills_the_worker_group_and_restarts_it() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("gc.pid");
    let w = python_worker(&[("RUNR_TIMEOUT", "5")]);
    let worker = w.get_when_up("/").json()["pid"].as_i64().unwrap() as i32;
    let r = w.get(&format!("/gc?file={}", pidfile.display()));
    assert_eq!(r.status, 504);
    assert_eq!(r.error(), "handler timed out after 5s");
    let grandchild: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_for(
        "the worker and its child to be gone",
        Duration::from_secs(60),
        || (!alive(worker) && !alive(grandchild)).then_some(()),
    );
    let r = w.get("/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ne!(r.json()["pid"].as_i64().unwrap() as i32, worker);
}

#[test]
fn the_timeout_counts_the_wait_for_a_worker() {
    let w = python_worker(&[("RUNR_TIMEOUT", "6")]);
    w.get_when_up("/");
    // One worker, two requests of 4 s: the second waits about 4 s for the worker and would
    // need 4 s more, so its 6 s run out (504); had the wait not counted, it would answer 200.
    let addr = w.addr();
    let a = std::thread::spawn(move || {
        crate::support::Conn::open(addr).send("GET", "/sleep?s=4", &[], Body::None)
    });
    w.wait_log("debug: got /sleep");
    let b = w.get("/sleep?s=4");
    let a = a.join().unwrap();
    assert_eq!(
        (a.status, b.status),
        (200, 504),
        "{} / {}",
        a.text(),
        b.text()
    );
    assert_eq!(b.error(), "handler timed out after 6s");
}

#[test]
fn a_response_line_over_10_mib_is_502() {
    let w = python_worker(&[]);
    let r = w.get("/huge");
    assert_eq!(r.status, 502);
    assert_eq!(r.error(), "handler output exceeds 10 MiB");
    // The worker was replaced; service goes on.
    assert_eq!(w.get("/").status, 200);
}

#[test]
fn many_requests_on_keep_alive_connections() {
    let f = fixtures();
    let mut vars = env("persistent", &[&f.path("echo_worker")]);
    vars.push(("RUNR_WORKERS".into(), "4".into()));
    let w = Wrapper::start(&vars);
    let counts = load(w.addr(), 8, 250, "/");
    assert_eq!(counts.get(&200), Some(&2000), "{counts:?}");
}

#[test]
fn a_json_line_printed_while_idle_goes_to_the_logs_not_to_the_next_request() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("idle_printer.py");
    std::fs::write(
        &script,
        r#"import json, sys, threading, time
def stray():
    time.sleep(0.2)
    print(json.dumps({"statusCode": 418, "body": "stray"}), flush=True)
n = 0
for line in sys.stdin:
    n += 1
    print(json.dumps({"statusCode": 200, "body": {"n": n}}), flush=True)
    if n == 1:
        threading.Thread(target=stray).start()
"#,
    )
    .unwrap();
    let script = script.display().to_string();
    let w = Wrapper::start(&env("persistent", &["python3", "-u", &script]));
    let r = w.get("/one");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["n"], 1);
    // The worker printed it between requests: logged as it came, unprefixed.
    w.wait_log("\n{\"statusCode\": 418, \"body\": \"stray\"}\n");
    let r = w.get("/two");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["n"], 2);
}

#[test]
fn a_request_written_to_a_worker_that_exits_unread_goes_to_another_worker() {
    // Each answer is the worker's last: the next request, back to back, is often written to a
    // worker that is exiting (before the wrapper saw it go). It never read it, so it must not
    // fail: another worker (or the restarted one) takes it.
    const REQUESTS: usize = 40;
    let f = fixtures();
    for workers in ["1", "2"] {
        let mut vars = env("persistent", &[&f.path("stress_worker")]);
        vars.push(("RUNR_WORKERS".into(), workers.into()));
        vars.push(("RUNR_LOG".into(), "info".into()));
        let w = Wrapper::start(&vars);
        let mut conn = crate::support::Conn::open(w.addr());
        let mut wrong = Vec::new();
        for i in 0..REQUESTS {
            let id = format!("r{i}");
            let r = conn.send(
                "GET",
                &format!("/answer-then-exit/{i}/3"),
                &[("X-Request-Id", &id)],
                Body::None,
            );
            if r.status != 200 || r.header("x-request-id") != Some(&id) {
                wrong.push(format!("{id}: {} {}", r.status, r.text()));
            }
        }
        assert!(
            wrong.is_empty(),
            "{workers} workers: {} of {REQUESTS} failed: {wrong:?}",
            wrong.len()
        );
    }
}

#[test]
fn a_request_the_worker_read_before_crashing_is_not_sent_again() {
    let f = fixtures();
    let mut vars = env("persistent", &[&f.path("stress_worker")]);
    vars.push(("RUNR_WORKERS".into(), "3".into()));
    let w = Wrapper::start(&vars);
    let r = w.send("GET", "/crash/3", &[("X-Request-Id", "poison")], b"");
    assert_eq!(r.status, 502);
    assert_eq!(r.error(), "handler process exited");
    w.wait_log("crashing on poison\n");
    // Served on: the other workers are fine, the crashed one restarts.
    assert_eq!(w.get("/answer/1/5").status, 200);
    assert_eq!(
        w.log().matches("crashing on poison").count(),
        1,
        "{}",
        w.log()
    );
}

#[test]
fn a_worker_that_exits_mid_request_is_noticed_even_while_a_child_holds_its_stdout() {
    // It reads the request, leaves a child holding stdout and exits: the answer is 502 at
    // once, not a 504 when the child finally lets go of the pipe.
    let w = Wrapper::start(&[
        ("RUNR_WRAPPER_MODE".into(), "persistent".into()),
        (
            "RUNR_COMMAND".into(),
            serde_json::to_string(&["bash", "-c", "read -r line; sleep 30 & exit 3"]).unwrap(),
        ),
        ("RUNR_TIMEOUT".into(), "20".into()),
    ]);
    // A 502, not the 504 it would be had the wrapper waited for the pipe to close.
    let r = w.get("/");
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.error(), "handler process exited");
}
