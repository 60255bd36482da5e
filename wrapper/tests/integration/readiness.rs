//! Knative probes: exec mode ready once listening; persistent mode not ready until every worker
//! has started (with RUNR_WORKER_READY=1: said `{"ready":true}`) and while none is alive.

use std::time::Duration;

use runr_testkit::wait_for;

use crate::support::telemetry::vars;
use crate::support::{env, RespExt, Wrapper};

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

/// A worker with the ready handshake: it waits until the file `$GATE_<slot>` exists (when that
/// is set), says it is ready (or, when the file `$DOWN` exists, exits first), then answers
/// whether a request had arrived before it was ready.
const HANDSHAKE: &str = r#"import json, os, select, sys, time
gate = os.environ.get("GATE_" + os.environ["RUNR_WORKER"])
while gate and not os.path.exists(gate):
    time.sleep(0.01)
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
    // Worker 1 gets ready when the test lets it, worker 0 at once.
    let gate = tempfile::tempdir().unwrap();
    let open = gate.path().join("open");
    let (w, _dir) = handshake_worker(&[("RUNR_WORKERS", "2"), ("GATE_1", open.to_str().unwrap())]);
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
    std::fs::write(&open, b"").unwrap();
    wait_for("both ready", Duration::from_secs(60), || {
        (probe(&w).0 == 200).then_some(())
    });
    assert_eq!(probe(&w), (200, "ok".to_string()));
    assert_eq!(w.log().matches("worker ready").count(), 2, "{}", w.log());
}

#[test]
fn no_request_reaches_a_worker_before_its_ready_line() {
    let gate = tempfile::tempdir().unwrap();
    let open = gate.path().join("open");
    let (w, _dir) = handshake_worker(&[
        ("GATE_0", open.to_str().unwrap()),
        ("RUNR_METRICS_PORT", "0"),
    ]);
    // Sent while the only worker is still starting: it waits (seen in the queue gauge) until
    // the worker has said it is ready.
    let addr = w.addr();
    let waiting = std::thread::spawn(move || {
        crate::support::Conn::open(addr).send("GET", "/", &[], crate::support::Body::None)
    });
    let m = crate::support::telemetry::metrics_addr(&w);
    wait_for("the request waiting", Duration::from_secs(60), || {
        (crate::support::telemetry::scrape(m).value("runr_queued_invocations", &[]) == 1.0)
            .then_some(())
    });
    std::fs::write(&open, b"").unwrap();
    let r = waiting.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["early"],
        false,
        "the request was written before ready"
    );
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
    let times = wait_for("five starts", Duration::from_secs(120), || {
        let text = std::fs::read_to_string(&starts).unwrap_or_default();
        let t: Vec<f64> = text.lines().filter_map(|l| l.parse().ok()).collect();
        (t.len() >= 5).then_some(t)
    });
    // The delays the wrapper chose, doubling, and each waited out before the next start.
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
        .take(4)
        .collect();
    assert_eq!(delays, [100, 200, 400, 800], "{}", w.log());
    for (i, pair) in times.windows(2).take(4).enumerate() {
        let gap = pair[1] - pair[0];
        assert!(gap >= delays[i] as f64 / 1000.0 * 0.99, "{i}: {gap:.3}s");
    }
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
