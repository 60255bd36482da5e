//! Stress with verification: many concurrent invocations whose answers the test knows in
//! advance, every answer compared byte for byte with its status and headers. Output sizes
//! straddle the pipe and buffer boundaries (0, 4 KiB and 64 KiB multiples and ±1 around them,
//! up to 1 MiB), because timing bugs in reading a handler's output show at some sizes and
//! concurrencies and not at others.

pub use runr_testkit::random::Rng;
use std::net::SocketAddr;
use std::sync::OnceLock;

use crate::support::{env, fixtures, pattern, Body, Conn, Resp, Wrapper};

/// Exec invocations per concurrency level.
const EXEC_REQUESTS: usize = 1600;
/// Persistent invocations per concurrency level.
const PERSISTENT_REQUESTS: usize = 1600;
/// The client counts every mode is driven at.
const CONCURRENCY: [usize; 2] = [8, 32];
/// Persistent workers.
const WORKERS: usize = 16;
/// Largest handler output asked for.
const MAX_SIZE: usize = 1 << 20;
/// Sizes every run asks for at least once (pipe pages, the pipe buffer, our read chunks).
const BOUNDARY_SIZES: &[usize] = &[
    0,
    1,
    2,
    4095,
    4096,
    4097,
    8191,
    8192,
    8193,
    65535,
    65536,
    65537,
    131071,
    131072,
    131073,
    MAX_SIZE - 1,
    MAX_SIZE,
];
/// Failures shown in full when a run fails (all are counted).
const SHOWN: usize = 10;

/// The pattern from 0 to 2 MiB: an answer of `size` bytes from `seed` is a slice of it.
fn master() -> &'static [u8] {
    static M: OnceLock<Vec<u8>> = OnceLock::new();
    M.get_or_init(|| (0..2 * MAX_SIZE as u32 + 2).map(pattern).collect())
}

/// The persistent worker's text: `ALPHABET[pattern(j) & 63]`.
fn text_master() -> &'static [u8] {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    static M: OnceLock<Vec<u8>> = OnceLock::new();
    M.get_or_init(|| {
        master()
            .iter()
            .map(|b| ALPHABET[usize::from(b & 63)])
            .collect()
    })
}

/// An output size: a fixed boundary size for the first requests of a run, then a mix of
/// uniform sizes, 4 KiB and 64 KiB multiples ±1, and small ones.
pub fn size(rng: &mut Rng, i: usize) -> usize {
    if let Some(s) = BOUNDARY_SIZES.get(i) {
        return *s;
    }
    let around = |k: u64, unit: u64, d: u64| (k * unit + d).saturating_sub(1).min(MAX_SIZE as u64);
    let s = match rng.below(4) {
        0 => rng.below(MAX_SIZE as u64 + 1),
        1 => around(rng.below(257), 4096, rng.below(3)),
        2 => around(rng.below(17), 65536, rng.below(3)),
        _ => rng.below(17),
    };
    s as usize
}

/// What an answer should have been, compared with what came; `None` when they agree.
fn mismatch(
    what: &str,
    got: &Resp,
    body: &[u8],
    content_type: &str,
    extra: Option<(&str, &str)>,
) -> Option<String> {
    let mut problems = Vec::new();
    if got.status != 200 {
        problems.push(format!("status {}", got.status));
    }
    if got.header("content-type") != Some(content_type) {
        problems.push(format!("content-type {:?}", got.header("content-type")));
    }
    if got.header("content-length") != Some(&body.len().to_string()) {
        problems.push(format!("content-length {:?}", got.header("content-length")));
    }
    if got.header("access-control-allow-origin") != Some("*") {
        problems.push("no access-control-allow-origin".into());
    }
    let mut expected_names = vec![
        "content-type",
        "content-length",
        "access-control-allow-origin",
        "date",
    ];
    if let Some((name, value)) = extra {
        expected_names.push(name);
        if got.header(name) != Some(value) {
            problems.push(format!(
                "{name} {:?} (expected {value:?})",
                got.header(name)
            ));
        }
    }
    let mut names: Vec<String> = got.headers.iter().map(|(n, _)| n.to_lowercase()).collect();
    names.sort();
    expected_names.sort();
    if names != expected_names {
        problems.push(format!("headers {names:?}"));
    }
    if got.body != body {
        let at = got
            .body
            .iter()
            .zip(body)
            .position(|(a, b)| a != b)
            .unwrap_or(got.body.len().min(body.len()));
        problems.push(format!(
            "body of {} bytes (expected {}), first difference at {at}",
            got.body.len(),
            body.len()
        ));
    }
    (!problems.is_empty()).then(|| format!("{what}: {}", problems.join(", ")))
}

/// The content type exec mode gives raw output: JSON when it parses, text otherwise.
fn raw_content_type(body: &[u8]) -> &'static str {
    let json = !body.trim_ascii().is_empty()
        && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok();
    if json {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    }
}

/// Runs `total` requests from `clients` threads, each on its own keep-alive connection;
/// `one(conn, rng, i)` sends request `i` of its thread and returns a failure description.
/// Returns every failure.
fn drive(
    addr: SocketAddr,
    clients: usize,
    total: usize,
    seed: u64,
    one: fn(&mut Conn, &mut Rng, usize, usize) -> Option<String>,
) -> Vec<String> {
    let per = total / clients;
    let threads: Vec<_> = (0..clients)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = Rng::new(seed ^ ((t as u64) << 32));
                let mut conn = Conn::open(addr);
                (0..per)
                    .filter_map(|i| one(&mut conn, &mut rng, t, i))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|h| h.join().expect("client thread"))
        .collect()
}

/// One run's result: mode, clients, requests, seed and the failures.
type Run = (&'static str, usize, usize, u64, Vec<String>);

/// Fails with every run's count of wrong answers (all levels run first, so one failure shows
/// how the others went too).
fn report(runs: &[Run]) {
    let counts: Vec<String> = runs
        .iter()
        .map(|(mode, clients, total, seed, f)| {
            format!(
                "{mode} at {clients} clients (seed {seed:#x}): {} of {total} wrong",
                f.len()
            )
        })
        .collect();
    let shown: Vec<&String> = runs.iter().flat_map(|r| r.4.iter()).take(SHOWN).collect();
    assert!(
        shown.is_empty(),
        "{}\ne.g.\n{}",
        counts.join("\n"),
        shown
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn exec_one(conn: &mut Conn, rng: &mut Rng, t: usize, i: usize) -> Option<String> {
    let size = size(rng, i);
    let seed = rng.below(MAX_SIZE as u64) as usize;
    let input: Vec<u8> = vec![b'i'; rng.below(2048) as usize];
    let path = format!("/answer/{seed}/{size}");
    let r = conn.send("POST", &path, &[], Body::Sized(&input));
    let body = &master()[seed..seed + size];
    mismatch(
        &format!("client {t} request {i} {path}"),
        &r,
        body,
        raw_content_type(body),
        None,
    )
}

#[test]
fn exec_answers_are_whole_under_concurrency() {
    let f = fixtures();
    let mut vars = env("exec", &[&f.path("stress_handler")]);
    vars.push(("RUNR_INPUT".into(), "raw".into()));
    // Debug lines per invocation would only slow the run down.
    vars.push(("RUNR_LOG".into(), "info".into()));
    let w = Wrapper::start(&vars);
    report(&at_every_concurrency(
        &w,
        "exec",
        EXEC_REQUESTS,
        0x5EED_0000,
        exec_one,
    ));
}

/// `requests` requests of `one`, spread over the clients, at each level of [`CONCURRENCY`]
/// (seeded from `seed`).
fn at_every_concurrency(
    w: &Wrapper,
    mode: &'static str,
    requests: usize,
    seed: u64,
    one: fn(&mut Conn, &mut Rng, usize, usize) -> Option<String>,
) -> Vec<Run> {
    CONCURRENCY
        .into_iter()
        .enumerate()
        .map(|(n, clients)| {
            let seed = seed + n as u64;
            let failures = drive(w.addr(), clients, requests, seed, one);
            (mode, clients, requests, seed, failures)
        })
        .collect()
}

fn persistent_one(conn: &mut Conn, rng: &mut Rng, t: usize, i: usize) -> Option<String> {
    let size = size(rng, i);
    let seed = rng.below(MAX_SIZE as u64) as usize;
    let id = format!("c{t}-r{i}-{}", rng.next_u64());
    let path = format!("/answer/{seed}/{size}");
    let r = conn.send("POST", &path, &[("X-Request-Id", &id)], Body::Sized(b"x"));
    mismatch(
        &format!("client {t} request {i} {path}"),
        &r,
        &text_master()[seed..seed + size],
        "text/plain; charset=utf-8",
        Some(("x-request-id", &id)),
    )
}

#[test]
fn persistent_answers_are_whole_and_tied_to_their_requests() {
    let f = fixtures();
    let mut vars = env("persistent", &[&f.path("stress_worker")]);
    vars.push(("RUNR_WORKERS".into(), WORKERS.to_string()));
    vars.push(("RUNR_LOG".into(), "info".into()));
    let w = Wrapper::start(&vars);
    report(&at_every_concurrency(
        &w,
        "persistent",
        PERSISTENT_REQUESTS,
        0x9E25_0000,
        persistent_one,
    ));
}
