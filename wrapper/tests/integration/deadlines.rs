//! Deadlines passed to the code (RUNR_DEADLINE_MS in exec mode, deadlineMs in the envelope of
//! both modes) and RUNR_KILL_GRACE: SIGTERM at the timeout, SIGKILL after the grace, the 504
//! answered at the timeout.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use runr_testkit::wait_for;

use crate::support::telemetry::vars;
use crate::support::{alive, env, Body, Conn, RespExt, Wrapper};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Sends `n` requests at once and checks each one's deadline lies in the window of its own
/// send time plus `timeout_ms`, through `deadline` (which reads it from the answer).
fn check_window(w: &Wrapper, n: usize, timeout_ms: u64, deadline: fn(&serde_json::Value) -> u64) {
    let addr = w.addr();
    let threads: Vec<_> = (0..n)
        .map(|i| {
            std::thread::spawn(move || {
                let before = now_ms();
                let r = Conn::open(addr).send("POST", &format!("/d{i}"), &[], Body::Sized(b"{}"));
                let after = now_ms();
                assert_eq!(r.status, 200, "{}", r.text());
                let d = deadline(&r.json());
                assert!(
                    before + timeout_ms <= d && d <= after + timeout_ms,
                    "deadline {d} outside [{}, {}]",
                    before + timeout_ms,
                    after + timeout_ms
                );
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn exec_handlers_see_their_deadline_in_the_environment_and_the_envelope() {
    let script = r#"import json, os, sys
req = json.load(sys.stdin)
print(json.dumps({"env": int(os.environ["RUNR_DEADLINE_MS"]), "envelope": req["deadlineMs"]}))
"#;
    let mut v = env("exec", &["python3", "-c", script]);
    v.extend(vars(&[("RUNR_TIMEOUT", "7.5")]));
    let w = Wrapper::start(&v);
    fn both(v: &serde_json::Value) -> u64 {
        assert_eq!(v["env"], v["envelope"], "{v}");
        v["env"].as_u64().unwrap()
    }
    check_window(&w, 8, 7500, both);
}

#[test]
fn persistent_workers_see_their_deadline_in_the_envelope() {
    let script = r#"import json, os, sys
for line in sys.stdin:
    req = json.loads(line)
    print(json.dumps({"deadline": req["deadlineMs"], "env": os.environ.get("RUNR_DEADLINE_MS")}), flush=True)
"#;
    let mut v = env("persistent", &["python3", "-u", "-c", script]);
    v.extend(vars(&[("RUNR_TIMEOUT", "20s"), ("RUNR_WORKERS", "2")]));
    let w = Wrapper::start(&v);
    fn deadline(v: &serde_json::Value) -> u64 {
        assert_eq!(
            v["env"],
            serde_json::Value::Null,
            "per-invocation variables are exec's"
        );
        v["deadline"].as_u64().unwrap()
    }
    check_window(&w, 8, 20_000, deadline);
}

/// Traps SIGTERM (writes the time to `$MARK`) and keeps running, so only SIGKILL ends it.
const TRAPS_TERM: &str = r#"echo $$ > "$PIDFILE"
trap 'date +%s.%N > "$MARK"' TERM
while :; do sleep 0.05; done"#;

#[test]
fn exec_kill_grace_answers_504_at_the_timeout_and_kills_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("mark");
    let pidfile = dir.path().join("pid");
    let mut v = env("exec", &["bash", "-c", TRAPS_TERM]);
    v.extend(vars(&[
        ("RUNR_TIMEOUT", "3"),
        ("RUNR_KILL_GRACE", "5s"),
        ("MARK", &mark.display().to_string()),
        ("PIDFILE", &pidfile.display().to_string()),
    ]));
    let w = Wrapper::start(&v);
    let started = Instant::now();
    let r = w.get("/");
    assert_eq!(
        (r.status, r.header("x-runr-error"), r.error().as_str()),
        (504, Some("timeout"), "handler timed out after 3s")
    );
    // The 504 came at the timeout, not after the grace: the handler still runs in it.
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(pid), "the 504 waited for the grace");
    wait_for("SIGTERM trapped", Duration::from_secs(60), || {
        mark.exists().then_some(())
    });
    wait_for("killed after the grace", Duration::from_secs(60), || {
        (!alive(pid)).then_some(())
    });
    let gone = started.elapsed();
    assert!(
        gone >= Duration::from_millis(7800),
        "killed before the grace ran out: {gone:?}"
    );
    w.wait_log("handler outlived its kill grace");
}

#[test]
fn exec_without_a_grace_kills_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("mark");
    let pidfile = dir.path().join("pid");
    let mut v = env("exec", &["bash", "-c", TRAPS_TERM]);
    v.extend(vars(&[
        ("RUNR_TIMEOUT", "3"),
        ("MARK", &mark.display().to_string()),
        ("PIDFILE", &pidfile.display().to_string()),
    ]));
    let w = Wrapper::start(&v);
    assert_eq!(w.get("/").status, 504);
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_for("killed at once", Duration::from_secs(60), || {
        (!alive(pid)).then_some(())
    });
    assert!(!mark.exists(), "SIGKILL, not SIGTERM");
}

#[test]
fn persistent_kill_grace_terms_the_worker_and_kills_it_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("mark");
    let script = r#"import json, os, signal, sys, time
def term(*_):
    with open(os.environ["MARK"], "w") as f:
        f.write(str(time.time()))
signal.signal(signal.SIGTERM, term)
for line in sys.stdin:
    req = json.loads(line)
    if req["path"] == "/sleep":
        while True:
            time.sleep(0.05)
    print(json.dumps({"pid": os.getpid()}), flush=True)
"#;
    let mut v = env("persistent", &["python3", "-u", "-c", script]);
    v.extend(vars(&[
        ("RUNR_TIMEOUT", "3"),
        ("RUNR_KILL_GRACE", "5s"),
        ("MARK", &mark.display().to_string()),
    ]));
    let w = Wrapper::start(&v);
    let pid = w.get_when_up("/").json()["pid"].as_i64().unwrap() as i32;
    let started = Instant::now();
    let r = w.get("/sleep");
    assert_eq!((r.status, r.header("x-runr-error")), (504, Some("timeout")));
    // Answered at the timeout: the worker still runs in its grace.
    assert!(alive(pid), "the 504 waited for the grace");
    wait_for("SIGTERM trapped", Duration::from_secs(60), || {
        mark.exists().then_some(())
    });
    wait_for("killed after the grace", Duration::from_secs(60), || {
        (!alive(pid)).then_some(())
    });
    assert!(
        started.elapsed() >= Duration::from_millis(7800),
        "{:?}",
        started.elapsed()
    );
    // Replaced: the next request is served by a new worker.
    let r = w.get("/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ne!(r.json()["pid"].as_i64().unwrap() as i32, pid);
}
