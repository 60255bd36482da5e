//! The soak's load: `CLIENTS` threads against a wrapper running the test fixtures'
//! `stress_handler` (exec) or `stress_worker` (persistent), for `SECONDS`, each request one of
//! a mix of faults whose right answer is known: outputs of random sizes (byte for byte), crashes,
//! timeouts, more than 10 MiB of output, orphans that hold stdout, workers that exit after
//! answering, clients that stall or go away mid-request. Prints one `RESULT` line (and the first
//! wrong answers on stderr). bench/soak.sh drives it.
//!
//!     soak_client <addr> <exec|persistent> <seconds> <clients> <timeout seconds>

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runr_testkit::http::{request_head, Body, Conn, Resp};

/// Largest output asked for.
const MAX_SIZE: usize = 1 << 20;
/// Clients that also send the slow requests (timeouts, stalled bodies): few, so that they
/// cannot hold every persistent worker and make fast requests time out in line.
const SLOW_CLIENTS: usize = 2;
/// Wrong answers shown in full.
const SHOWN: usize = 20;

fn pattern(j: u32) -> u8 {
    (j.wrapping_mul(2654435761) >> 24) as u8
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn size(&mut self) -> usize {
        let around = |k: u64, unit: u64, d: u64| (k * unit + d).saturating_sub(1) as usize;
        match self.below(4) {
            0 => self.below(MAX_SIZE as u64 + 1) as usize,
            1 => around(self.below(257), 4096, self.below(3)).min(MAX_SIZE),
            2 => around(self.below(17), 65536, self.below(3)).min(MAX_SIZE),
            _ => self.below(17) as usize,
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Exec,
    Persistent,
}

/// What one request was and what it must get.
struct Case {
    kind: &'static str,
    path: String,
    id: String,
    /// Status, and the body exactly (`None`: any body, e.g. a slept answer's text).
    status: u16,
    body: Option<Vec<u8>>,
    /// Sent as a head and part of a body, then the connection is dropped (no answer).
    disconnect: bool,
    /// Sent as a head and part of a body, then the client waits (408 at the deadline).
    stall: bool,
}

fn case(mode: Mode, rng: &mut Rng, slow: bool, n: u64, timeout: u64) -> Case {
    let id = format!("soak-{n}");
    let error = |msg: &str| Some(format!(r#"{{"error":"{msg}"}}"#).into_bytes());
    let answer = |rng: &mut Rng, kind: &'static str, route: &str| {
        let (seed, size) = (rng.below(MAX_SIZE as u64) as u32, rng.size());
        let body = match mode {
            Mode::Exec => (0..size as u32).map(|i| pattern(seed + i)).collect(),
            Mode::Persistent => {
                const A: &[u8; 64] =
                    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
                (0..size as u32)
                    .map(|i| A[usize::from(pattern(seed + i) & 63)])
                    .collect()
            }
        };
        Case {
            kind,
            path: format!("/{route}/{seed}/{size}"),
            id: id.clone(),
            status: 200,
            body: Some(body),
            disconnect: false,
            stall: false,
        }
    };
    let roll = rng.below(100);
    let mut c = match roll {
        0..=4 if slow => Case {
            kind: "timeout",
            path: format!("/sleep/{}", timeout * 1000 + 1000),
            id: id.clone(),
            status: 504,
            body: error(&format!("handler timed out after {timeout}s")),
            disconnect: false,
            stall: false,
        },
        5..=9 if slow => Case {
            kind: "stall",
            path: "/answer/0/1".into(),
            id: id.clone(),
            status: 408,
            body: error("request body not received in time"),
            disconnect: false,
            stall: true,
        },
        0..=9 => answer(rng, "answer", "answer"),
        10..=19 => {
            let code = 1 + rng.below(100);
            match mode {
                Mode::Exec => Case {
                    kind: "crash",
                    path: format!("/crash/{code}"),
                    id: id.clone(),
                    status: 500,
                    body: error(&format!("handler exited with status {code}")),
                    disconnect: false,
                    stall: false,
                },
                Mode::Persistent => Case {
                    kind: "crash",
                    path: format!("/crash/{code}"),
                    id: id.clone(),
                    status: 502,
                    body: error("handler process exited"),
                    disconnect: false,
                    stall: false,
                },
            }
        }
        20..=22 => Case {
            kind: "flood",
            path: "/flood".into(),
            id: id.clone(),
            status: 502,
            body: error("handler output exceeds 10 MiB"),
            disconnect: false,
            stall: false,
        },
        23..=32 => answer(rng, "orphan", "orphan"),
        33..=37 if mode == Mode::Persistent => answer(rng, "exit-after", "answer-then-exit"),
        38..=42 => Case {
            disconnect: true,
            ..answer(rng, "disconnect", "answer")
        },
        _ => answer(rng, "answer", "answer"),
    };
    c.id = id;
    c
}

/// Sends `c` on `conn` (a new connection when the last one is gone) and checks the answer.
fn run(addr: SocketAddr, conn: &mut Option<Conn>, c: &Case) -> Result<(), String> {
    if c.disconnect || c.stall {
        let mut fresh = Conn::open(addr);
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: soak\r\nX-Request-Id: {}\r\nContent-Length: 1000\r\n\r\npartial",
            c.path, c.id
        );
        fresh
            .stream()
            .write_all(head.as_bytes())
            .map_err(|e| e.to_string())?;
        if c.disconnect {
            return Ok(());
        }
        return check(c, fresh.try_read_response()?);
    }
    let mut current = conn.take().unwrap_or_else(|| Conn::open(addr));
    let head = request_head("GET", &c.path, &[("X-Request-Id", &c.id)], &Body::None);
    current
        .stream()
        .write_all(head.as_bytes())
        .map_err(|e| e.to_string())?;
    let r = current.try_read_response()?;
    let keep = !r
        .header("connection")
        .is_some_and(|v| v.eq_ignore_ascii_case("close"));
    let checked = check(c, r);
    if keep {
        *conn = Some(current);
    }
    checked
}

fn check(c: &Case, r: Resp) -> Result<(), String> {
    if r.status != c.status {
        let text: String = r.text().chars().take(200).collect();
        return Err(format!("status {} {text}", r.status));
    }
    if let Some(body) = &c.body {
        if &r.body != body {
            return Err(format!(
                "body of {} bytes, expected {}",
                r.body.len(),
                body.len()
            ));
        }
    }
    if r.header("access-control-allow-origin") != Some("*") {
        return Err("no access-control-allow-origin".into());
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, mode, seconds, clients, timeout] = args.as_slice() else {
        eprintln!(
            "usage: soak_client <addr> <exec|persistent> <seconds> <clients> <timeout seconds>"
        );
        std::process::exit(2);
    };
    let addr: SocketAddr = addr.parse().expect("addr");
    let mode = if mode == "exec" {
        Mode::Exec
    } else {
        Mode::Persistent
    };
    let until = Instant::now() + Duration::from_secs(seconds.parse().expect("seconds"));
    let clients: usize = clients.parse().expect("clients");
    let timeout: u64 = timeout.parse().expect("timeout");
    let sent = Arc::new(AtomicU64::new(0));
    let wrong = Arc::new(Mutex::new(Vec::<String>::new()));
    let kinds = Arc::new(Mutex::new(std::collections::BTreeMap::<&str, u64>::new()));
    let threads: Vec<_> = (0..clients)
        .map(|t| {
            let (sent, wrong, kinds) = (sent.clone(), wrong.clone(), kinds.clone());
            std::thread::spawn(move || {
                let mut rng = Rng((0x50AC_0000 + t as u64 * 0x9E37_79B9) | 1);
                let mut conn = None;
                while Instant::now() < until {
                    let n = sent.fetch_add(1, Ordering::Relaxed);
                    let c = case(mode, &mut rng, t < SLOW_CLIENTS, n, timeout);
                    *kinds.lock().unwrap().entry(c.kind).or_default() += 1;
                    if let Err(e) = run(addr, &mut conn, &c) {
                        conn = None;
                        wrong
                            .lock()
                            .unwrap()
                            .push(format!("{} {} {}: {e}", c.kind, c.path, c.id));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let wrong = wrong.lock().unwrap();
    for w in wrong.iter().take(SHOWN) {
        eprintln!("wrong: {w}");
    }
    let kinds: Vec<String> = kinds
        .lock()
        .unwrap()
        .iter()
        .map(|(k, n)| format!("{k}={n}"))
        .collect();
    println!(
        "RESULT requests={} wrong={} {}",
        sent.load(Ordering::Relaxed),
        wrong.len(),
        kinds.join(" ")
    );
}
