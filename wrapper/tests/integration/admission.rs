//! Admission control: `RUNR_MAX_INFLIGHT` handlers at once (exec), one per worker (persistent),
//! `RUNR_MAX_QUEUE` requests in line; beyond that 503 `overloaded` with `Retry-After: 1`,
//! decided without reading the body; the wait counts against `RUNR_TIMEOUT`.

use std::io::Write;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use runr_testkit::http::{Body, Resp};
use runr_testkit::wait_for;
use runr_testkit::MIB;

use crate::support::{children_of, env, fixtures, status_kib, Conn, Gate, RespExt, Wrapper};

/// Requests sent at once.
const CLIENTS: usize = 20;
/// Body of each: large, so that a body read too early shows in the wrapper's RSS.
const BODY: usize = 8 * 1024 * 1024;
/// How long the refusals may take to arrive (they come before any handler finishes).
const REFUSALS_WITHIN: Duration = Duration::from_secs(60);

fn vars(mode: &str, command: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v = env(mode, &[command]);
    v.push(("RUNR_LOG".into(), "info".into()));
    v.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    v
}

fn is_overloaded(r: &Resp) -> bool {
    r.status == 503
        && r.header("retry-after") == Some("1")
        && r.header("content-type") == Some("application/json")
        && r.body == br#"{"error":"overloaded"}"#
}

/// Sends `CLIENTS` requests to `/gate` at once, each with `body`; expects exactly `refused`
/// of them to be refused at once while the handlers wait at the gate, then opens it and
/// expects the rest to be served. Returns the served answers.
fn overload(w: &Wrapper, gate: &Gate, body: &'static [u8], refused: usize) -> Vec<Resp> {
    let (tx, rx) = mpsc::channel();
    for _ in 0..CLIENTS {
        let (addr, tx) = (w.addr(), tx.clone());
        std::thread::spawn(move || {
            let r = Conn::open(addr).send("POST", "/gate", &[], Body::Sized(body));
            let _ = tx.send(r);
        });
    }
    let deadline = Instant::now() + REFUSALS_WITHIN;
    let mut early = Vec::new();
    while early.len() < refused {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(r) => early.push(r),
            Err(_) => break,
        }
    }
    let statuses: Vec<u16> = early.iter().map(|r| r.status).collect();
    assert_eq!(
        early.iter().filter(|r| is_overloaded(r)).count(),
        refused,
        "answers before the gate opened: {statuses:?}"
    );
    // The line is full: a request that sends its head but never its body is refused at once.
    let mut c = Conn::open(w.addr());
    let head = format!("POST /gate HTTP/1.1\r\nHost: t\r\nContent-Length: {BODY}\r\n\r\n");
    c.stream().write_all(head.as_bytes()).unwrap();
    let r = c.read_response();
    assert!(
        is_overloaded(&r),
        "{} {:?} {}",
        r.status,
        r.headers,
        r.text()
    );
    gate.open();
    let served: Vec<Resp> = (0..CLIENTS - refused)
        .map(|_| {
            rx.recv_timeout(Duration::from_secs(120))
                .expect("an answer")
        })
        .collect();
    for r in &served {
        assert_eq!(r.status, 200, "{}", r.text());
    }
    served
}

fn body() -> &'static [u8] {
    static B: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    B.get_or_init(|| vec![b'b'; BODY])
}

#[test]
fn exec_two_at_once_four_in_line_the_rest_503_without_reading_their_bodies() {
    let gate = Gate::new();
    let mut v = vars(
        "exec",
        &fixtures().path("stress_handler"),
        &[
            ("RUNR_MAX_INFLIGHT", "2"),
            ("RUNR_MAX_QUEUE", "4"),
            ("RUNR_TIMEOUT", "300"),
        ],
    );
    v.push(gate.var());
    let w = Wrapper::start(&v);
    let served = overload(&w, &gate, body(), CLIENTS - 6);
    assert_eq!(served.len(), 6);
    for r in &served {
        // The handler read the whole envelope: the body and the rest.
        let n: usize = r.text().strip_prefix("ok ").unwrap().parse().unwrap();
        assert!(n > BODY, "{n}");
    }
    // Two bodies at a time at most: the 14 refused and the 4 waiting never had theirs read.
    let peak = status_kib(w.pid(), "VmHWM") * 1024;
    let max = (1.15 * 2.0 * BODY as f64) as u64 + 32 * MIB as u64;
    assert!(
        peak <= max,
        "peak RSS {} MiB > {} MiB",
        peak / MIB as u64,
        max / MIB as u64
    );
}

#[test]
fn persistent_one_per_worker_three_in_line_the_rest_503() {
    let gate = Gate::new();
    let mut v = vars(
        "persistent",
        &fixtures().path("stress_worker"),
        &[
            ("RUNR_WORKERS", "2"),
            ("RUNR_MAX_QUEUE", "3"),
            ("RUNR_TIMEOUT", "300"),
        ],
    );
    v.push(gate.var());
    let w = Wrapper::start(&v);
    let served = overload(&w, &gate, b"small", CLIENTS - 5);
    assert_eq!(served.len(), 5);
    for r in &served {
        assert!(r.text().starts_with("ok "), "{}", r.text());
    }
}

#[test]
fn the_wait_for_a_slot_counts_against_the_timeout() {
    let w = Wrapper::start(&vars(
        "exec",
        &fixtures().path("stress_handler"),
        &[("RUNR_MAX_INFLIGHT", "1"), ("RUNR_TIMEOUT", "6")],
    ));
    let addr = w.addr();
    let first = std::thread::spawn(move || {
        crate::support::Conn::open(addr).send("GET", "/sleep/4000", &[], Body::None)
    });
    wait_for("the first handler to run", Duration::from_secs(30), || {
        (!children_of(w.pid() as i32).is_empty()).then_some(())
    });
    // It waits about 4 s for the slot and would need 4 s more: its 6 s run out (504). Had the
    // wait not counted, it would have run its 4 s within a fresh 6 s and answered 200.
    let sent = Instant::now();
    let second = w.get("/sleep/4000");
    let took = sent.elapsed();
    assert_eq!(second.status, 504, "{}", second.text());
    assert_eq!(second.error(), "handler timed out after 6s");
    assert!(
        took >= Duration::from_secs(5),
        "{took:?}: answered before its time"
    );
    let first = first.join().unwrap();
    assert_eq!((first.status, first.text().as_str()), (200, "slept"));
}
