//! The memory bound: an invocation holds its request body once (the envelope is encoded into
//! the handler's stdin piece by piece, never whole next to it), and requests waiting for a slot
//! hold none. Measured as the wrapper's peak RSS (VmHWM) while 64 requests of 9 MiB are in
//! the wrapper at once: their handlers wait at a gate before reading stdin, so every body is
//! held at the same moment.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use runr_testkit::http::{request_head, Body};
use runr_testkit::wait_for;
use runr_testkit::MIB;

use crate::support::{children_of, env, fixtures, status_kib, Conn, Gate, Wrapper};

/// Requests at once.
const REQUESTS: usize = 64;
/// Body of each.
const BODY: usize = 9 * 1024 * 1024;
/// What the wrapper may take besides the bodies (binary, runtime, buffers).
const OVERHEAD: u64 = 32 * MIB as u64;

/// Sends `REQUESTS` POSTs of `BODY` bytes to `/gate` at once, waits until `running` handlers
/// wait at the gate, opens it, checks every answer and returns the wrapper's peak RSS in
/// bytes.
fn peak_rss(vars: &[(String, String)], gate: &Gate, running: usize) -> u64 {
    let w = Wrapper::start(vars);
    let pid = w.pid();
    let idle = status_kib(pid, "VmRSS");
    let body: Arc<Vec<u8>> = Arc::new((0..BODY).map(|i| b'a' + (i % 26) as u8).collect());
    let clients: Vec<_> = (0..REQUESTS)
        .map(|_| {
            let (addr, body) = (w.addr(), body.clone());
            std::thread::spawn(move || post(addr, &body))
        })
        .collect();
    wait_for(
        &format!("{running} handlers at the gate"),
        Duration::from_secs(120),
        || (children_of(pid as i32).len() >= running).then_some(()),
    );
    gate.open();
    for c in clients {
        let r = c.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let n: usize = r.text().strip_prefix("ok ").unwrap().parse().unwrap();
        assert!(n >= BODY, "the handler read {n} bytes");
    }
    let peak = status_kib(pid, "VmHWM") * 1024;
    eprintln!(
        "peak RSS {:.1} MiB (idle {:.1} MiB) for {REQUESTS} x {} MiB, {vars:?}",
        peak as f64 / MIB as f64,
        idle as f64 / 1024.0,
        BODY as u64 / MIB as u64
    );
    peak
}

/// One request written from the shared body (no copy per client), then its answer.
fn post(addr: SocketAddr, body: &[u8]) -> runr_testkit::http::Resp {
    let mut c = Conn::open(addr);
    let head = request_head("POST", "/gate", &[], &Body::Sized(body));
    c.stream().write_all(head.as_bytes()).unwrap();
    c.stream().write_all(body).unwrap();
    c.read_response()
}

fn vars(gate: &Gate, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v = env("exec", &[&fixtures().path("stress_handler")]);
    v.push(gate.var());
    v.push(("RUNR_LOG".into(), "info".into()));
    v.push(("RUNR_TIMEOUT".into(), "300".into()));
    v.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    v
}

fn bound(factor: f64, bodies: usize) -> u64 {
    (factor * (bodies * BODY) as f64) as u64 + OVERHEAD
}

#[test]
fn json_input_holds_each_body_once() {
    let gate = Gate::new();
    let peak = peak_rss(&vars(&gate, &[]), &gate, REQUESTS);
    let max = bound(1.15, REQUESTS);
    assert!(
        peak <= max,
        "peak RSS {} MiB > {} MiB",
        peak / MIB as u64,
        max / MIB as u64
    );
}

#[test]
fn raw_input_holds_each_body_once() {
    let gate = Gate::new();
    let peak = peak_rss(&vars(&gate, &[("RUNR_INPUT", "raw")]), &gate, REQUESTS);
    let max = bound(1.0, REQUESTS);
    assert!(
        peak <= max,
        "peak RSS {} MiB > {} MiB",
        peak / MIB as u64,
        max / MIB as u64
    );
}

#[test]
fn waiting_requests_hold_no_body() {
    // Eight at once, the other 56 in line (their bodies not read until they get a slot).
    let gate = Gate::new();
    let peak = peak_rss(&vars(&gate, &[("RUNR_MAX_INFLIGHT", "8")]), &gate, 8);
    let max = bound(1.15, 8);
    assert!(
        peak <= max,
        "peak RSS {} MiB > {} MiB",
        peak / MIB as u64,
        max / MIB as u64
    );
}
