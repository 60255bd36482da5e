//! Worker recycling (RUNR_WORKER_MAX_REQUESTS, RUNR_WORKER_MAX_AGE): under load no request
//! fails, the replacement is started first (ready handshake included), and the old worker gets
//! EOF, SIGTERM after 5 s and SIGKILL after 5 more.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use runr_testkit::wait_for;

use crate::support::telemetry::{metrics_addr, scrape, vars};
use crate::support::{alive, env, fixtures, Body, Conn, RespExt, Wrapper};

/// `threads` clients × `per` requests at once, every answer checked (status, echoed body);
/// returns how many requests each pid answered.
fn load_checked(w: &Wrapper, threads: usize, per: usize) -> HashMap<i64, usize> {
    let addr = w.addr();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                let mut pids = HashMap::new();
                for i in 0..per {
                    let body = format!("{t}:{i}");
                    let r = c.send("POST", "/", &[], Body::Sized(body.as_bytes()));
                    assert_eq!(r.status, 200, "{t}:{i} {}", r.text());
                    assert_eq!(r.header("x-runr-error"), None);
                    let v = r.json();
                    assert_eq!(v["body"], body.as_str());
                    *pids.entry(v["pid"].as_i64().unwrap()).or_insert(0) += 1;
                }
                pids
            })
        })
        .collect();
    let mut all = HashMap::new();
    for h in hs {
        for (pid, n) in h.join().unwrap() {
            *all.entry(pid).or_insert(0) += n;
        }
    }
    all
}

#[test]
fn recycling_by_request_count_under_load_fails_no_request() {
    let f = fixtures();
    let mut v = env("persistent", &["python3", "-u", &f.path("worker.py")]);
    v.extend(vars(&[
        ("RUNR_WORKERS", "2"),
        ("RUNR_WORKER_MAX_REQUESTS", "10"),
        ("RUNR_METRICS_PORT", "0"),
    ]));
    let w = Wrapper::start(&v);
    let served = load_checked(&w, 8, 40);
    // 320 requests, at most 11 per worker (10 ± 10 %, rounded): at least 30 workers served.
    assert!(served.values().all(|n| *n <= 11), "{served:?}");
    assert!(
        served.len() >= 30,
        "{} workers for 320 requests",
        served.len()
    );
    let pids: HashSet<i64> = served.into_keys().collect();
    let s = scrape(metrics_addr(&w));
    assert_eq!(
        s.value("runr_worker_restarts_total", &[]),
        0.0,
        "recycling is not a restart"
    );
    assert_eq!(
        s.value(
            "faas_invocations_total",
            &[("trigger", "http"), ("code", "2xx")]
        ),
        320.0
    );
    // Each was started (a cold start of its own) and wound down by EOF: none left running.
    assert_eq!(
        s.value("faas_coldstarts_total", &[("trigger", "http")]),
        pids.len() as f64
    );
    let log = w.log();
    assert!(
        log.matches("recycling worker").count() >= pids.len() - 2,
        "{log}"
    );
    wait_for("the recycled workers gone", Duration::from_secs(20), || {
        pids.iter()
            .filter(|p| alive(**p as i32))
            .count()
            .le(&2)
            .then_some(())
    });
}

#[test]
fn recycling_waits_for_the_replacements_ready_line_and_fails_no_request() {
    // Slow to get ready; one worker, so requests arrive while its replacement starts (and
    // the worker due for recycling serves them meanwhile).
    let script = r#"import json, os, sys, time
time.sleep(0.3)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    time.sleep(0.01)
    print(json.dumps({"pid": os.getpid(), "body": req["body"]}), flush=True)
"#;
    let mut v = env("persistent", &["python3", "-u", "-c", script]);
    v.extend(vars(&[
        ("RUNR_WORKER_READY", "1"),
        ("RUNR_WORKER_MAX_REQUESTS", "5"),
    ]));
    let w = Wrapper::start(&v);
    // About 4 s of requests at 100 a second at most; a replacement is ready ~0.3 s after it
    // was started.
    let pids = load_checked(&w, 4, 100);
    assert!(pids.len() >= 4, "{pids:?}");
    // Due after 5 (± 10 %), it serves on only until its replacement is ready.
    assert!(
        pids.values().filter(|n| **n >= 5).count() >= pids.len() - 1,
        "{pids:?}"
    );
    // Each replacement said it was ready before its predecessor was recycled.
    let log = w.log();
    let ready = log.matches("worker ready").count();
    let recycled = log.matches("recycling worker").count();
    assert!(ready > recycled && recycled >= pids.len() - 1, "{log}");
}

#[test]
fn recycling_by_age_replaces_idle_and_busy_workers() {
    let f = fixtures();
    let mut v = env("persistent", &["python3", "-u", &f.path("worker.py")]);
    v.extend(vars(&[("RUNR_WORKER_MAX_AGE", "1s")]));
    let w = Wrapper::start(&v);
    let first = w.get_when_up("/").json()["pid"].as_i64().unwrap();
    // Idle past its age: replaced without any request.
    wait_for("replaced while idle", Duration::from_secs(60), || {
        w.log().contains("recycling worker").then_some(())
    });
    // Busy ones too: requests one after another keep being served while the workers are
    // replaced under them, until three different ones have answered.
    let mut seen = HashSet::from([first]);
    wait_for("three workers in turn", Duration::from_secs(120), || {
        let r = w.get("/");
        assert_eq!(r.status, 200, "{}", r.text());
        seen.insert(r.json()["pid"].as_i64().unwrap());
        (seen.len() >= 3).then_some(())
    });
    wait_for("the first worker gone", Duration::from_secs(60), || {
        (!alive(first as i32)).then_some(())
    });
}

#[test]
fn a_recycled_worker_gets_eof_then_sigterm_after_5s_then_sigkill_after_5_more() {
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    // Ignores EOF and SIGTERM (writing down when each came); answers one request per line.
    let script = format!(
        r#"import json, os, signal, sys, time
marks = {marks:?}
def note(what):
    with open(marks, "a") as f:
        f.write(f"{{os.getpid()}} {{what}} {{time.time()}}\n")
signal.signal(signal.SIGTERM, lambda *_: note("term"))
for line in sys.stdin:
    print(json.dumps({{"pid": os.getpid()}}), flush=True)
note("eof")
while True:
    time.sleep(0.05)
"#,
        marks = marks.display().to_string()
    );
    let mut v = env("persistent", &["python3", "-u", "-c", &script]);
    v.extend(vars(&[("RUNR_WORKER_MAX_REQUESTS", "1")]));
    let w = Wrapper::start(&v);
    let old = w.get_when_up("/").json()["pid"].as_i64().unwrap();
    // The replacement serves the next request.
    let r = w.get("/");
    assert_eq!(r.status, 200);
    assert_ne!(r.json()["pid"].as_i64().unwrap(), old);
    let at = |what: &str| -> f64 {
        let needle = format!("{old} {what} ");
        let line = wait_for(&format!("{what} of {old}"), Duration::from_secs(60), || {
            std::fs::read_to_string(&marks)
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with(&needle))
                .map(str::to_string)
        });
        line.rsplit_once(' ').unwrap().1.parse().unwrap()
    };
    // In order, each step waiting out its 5 s (lower bounds; the waits above are hang guards).
    let eof = at("eof");
    let term = at("term");
    assert!(term - eof >= 4.9, "SIGTERM {:.2}s after EOF", term - eof);
    wait_for("SIGKILL", Duration::from_secs(60), || {
        (!alive(old as i32)).then_some(())
    });
    let gone = now();
    assert!(
        gone - term >= 4.9,
        "killed {:.2}s after SIGTERM",
        gone - term
    );
    assert!(
        w.log().contains("worker ignored SIGTERM; killing it"),
        "{}",
        w.log()
    );
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
