//! Knative probes: exec mode ready once listening; persistent mode not ready until every worker
//! has started (with RUNR_WORKER_READY=1: said `{"ready":true}`) and while none is alive.

use std::time::Duration;

use runr_testkit::wait_for;

use crate::support::{env, RespExt, Wrapper};
use crate::telemetry_support::vars;

fn probe(w: &Wrapper) -> (u16, String) {
    let r = w.send("GET", "/", &[("K-Kubelet-Probe", "1.30")], b"");
    (r.status, r.text())
}

const NOT_READY: (u16, &str) = (503, r#"{"error":"no worker is ready"}"#);

#[test]
fn exec_mode_is_ready_once_listening() {
    let w = Wrapper::start(&env("exec", &["cat"]));
    assert_eq!(probe(&w), (200, "ok".to_string()));
}

/// A worker with the ready handshake: it waits `$DELAY_<slot>` seconds, says it is ready (or,
/// when the file `$DOWN` exists, exits first), then answers whether a request had arrived
/// before it was ready.
const HANDSHAKE: &str = r#"import json, os, select, sys, time
time.sleep(float(os.environ.get("DELAY_" + os.environ["RUNR_WORKER"], "0")))
if os.path.exists(os.environ["DOWN"]):
    sys.exit(4)
early = bool(select.select([sys.stdin], [], [], 0)[0])
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req["path"] == "/down":
        open(os.environ["DOWN"], "w").close()
        sys.exit(5)
    print(json.dumps({"worker": os.environ["RUNR_WORKER"], "early": early, "pid": os.getpid()}), flush=True)
"#;

fn handshake_worker(extra: &[(&str, &str)]) -> (Wrapper, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("handshake.py");
    std::fs::write(&script, HANDSHAKE).unwrap();
    let down = dir.path().join("down");
    let mut v = env(
        "persistent",
        &["python3", "-u", &script.display().to_string()],
    );
    v.extend(vars(&[
        ("RUNR_WORKER_READY", "1"),
        ("DOWN", &down.display().to_string()),
    ]));
    v.extend(vars(extra));
    (Wrapper::start(&v), dir)
}

#[test]
fn persistent_mode_waits_for_every_worker_to_say_ready() {
    // Worker 1 takes 2 s to get ready, worker 0 none.
    let (w, _dir) = handshake_worker(&[("RUNR_WORKERS", "2"), ("DELAY_1", "2")]);
    let p = probe(&w);
    assert_eq!(
        (p.0, p.1.as_str()),
        NOT_READY,
        "one worker is not ready yet"
    );
    // A request meanwhile goes to the ready one, never to the one still starting.
    let r = w.get("/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["worker"], "0");
    wait_for("both ready", Duration::from_secs(20), || {
        (probe(&w).0 == 200).then_some(())
    });
    assert_eq!(probe(&w), (200, "ok".to_string()));
    assert_eq!(w.log().matches("worker ready").count(), 2, "{}", w.log());
}

#[test]
fn no_request_reaches_a_worker_before_its_ready_line() {
    let (w, _dir) = handshake_worker(&[("DELAY_0", "1")]);
    // Sent while the only worker is still starting: it waits for the ready line.
    let started = std::time::Instant::now();
    let r = w.get("/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["early"],
        false,
        "the request was written before ready"
    );
    assert!(started.elapsed() >= Duration::from_millis(500));
    // The ready line itself is protocol, not an answer and not a log line.
    assert!(!w.log().contains("{\"ready\": true}"), "{}", w.log());
}

#[test]
fn probes_answer_503_while_every_worker_is_down_and_200_once_one_is_back() {
    let (w, dir) = handshake_worker(&[]);
    wait_for("ready", Duration::from_secs(20), || {
        (probe(&w).0 == 200).then_some(())
    });
    // The worker exits, and every restart exits before it is ready: none alive.
    let r = w.get("/down");
    assert_eq!((r.status, r.header("x-runr-error")), (502, Some("crash")));
    wait_for(
        "a restart that exited early",
        Duration::from_secs(20),
        || {
            w.log()
                .contains("worker exited before it was ready")
                .then_some(())
        },
    );
    for _ in 0..5 {
        let p = probe(&w);
        assert_eq!((p.0, p.1.as_str()), NOT_READY);
        std::thread::sleep(Duration::from_millis(50));
    }
    // Back: the next restart gets ready (the backoff is short still).
    std::fs::remove_file(dir.path().join("down")).unwrap();
    wait_for("ready again", Duration::from_secs(30), || {
        (probe(&w).0 == 200).then_some(())
    });
    assert_eq!(w.get("/").status, 200);
}

#[test]
fn a_worker_exiting_before_ready_is_restarted_with_doubling_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let script = format!("date +%s.%N >> {}; sleep 0.05; exit 1", starts.display());
    let mut v = env("persistent", &["bash", "-c", &script]);
    v.extend(vars(&[("RUNR_WORKER_READY", "1")]));
    let w = Wrapper::start(&v);
    let times = wait_for("five starts", Duration::from_secs(20), || {
        let text = std::fs::read_to_string(&starts).unwrap_or_default();
        let t: Vec<f64> = text.lines().filter_map(|l| l.parse().ok()).collect();
        (t.len() >= 5).then_some(t)
    });
    let gaps: Vec<f64> = times.windows(2).map(|p| p[1] - p[0]).collect();
    // 0.1, 0.2, 0.4, 0.8 s plus the 50 ms it lived each time.
    assert!(
        gaps[3] > gaps[1] * 1.5 && gaps[2] > gaps[0] * 1.3,
        "{gaps:?}"
    );
    assert_eq!(probe(&w).0, 503);
}

#[test]
fn a_worker_that_never_says_ready_is_killed_after_runr_tick_wait_and_restarted() {
    let mut v = env(
        "persistent",
        &["bash", "-c", "echo $$ >> \"$PIDS\"; exec sleep 600"],
    );
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    v.extend(vars(&[
        ("RUNR_WORKER_READY", "1"),
        ("RUNR_TICK_WAIT", "1s"),
        ("PIDS", &pids.display().to_string()),
    ]));
    let w = Wrapper::start(&v);
    let started = wait_for("a second start", Duration::from_secs(20), || {
        let text = std::fs::read_to_string(&pids).unwrap_or_default();
        let p: Vec<i32> = text.lines().filter_map(|l| l.parse().ok()).collect();
        (p.len() >= 2).then_some(p)
    });
    assert!(!crate::support::alive(started[0]), "the first was killed");
    assert!(
        w.log().contains("worker did not say it was ready in time"),
        "{}",
        w.log()
    );
    let p = probe(&w);
    assert_eq!((p.0, p.1.as_str()), NOT_READY);
}
