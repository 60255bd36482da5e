//! Support for the http-mode, schedule, proxy and replay tests: the python3 upstream fixture, a
//! one-shot runner for the wrapper, the access-line parser and the test OTLP collector (testkit's).

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use runr_testkit::{free_port, Child};

use crate::support::{bin, Wrapper};

/// `python3 <upstream.py>` as a RUNR_COMMAND JSON array.
pub fn upstream_command() -> String {
    serde_json::to_string(&["python3", &upstream_script()]).unwrap()
}

pub fn upstream_script() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/upstream.py")
        .to_string_lossy()
        .into_owned()
}

/// The CloudEvents consumer of the tick crate's tests.
pub fn ce_receiver_script() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tick/tests/fixtures/ce_receiver.py")
        .to_string_lossy()
        .into_owned()
}

/// The observed proxy in front of the python upstream, with `extra` variables.
pub fn start_proxy(extra: &[(&str, String)]) -> Proxy {
    let mut vars = vec![
        ("RUNR_WRAPPER_MODE".to_string(), "http".to_string()),
        ("RUNR_COMMAND".to_string(), upstream_command()),
        ("RUNR_UPSTREAM_PORT".to_string(), free_port().to_string()),
    ];
    vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    Proxy::start(&vars)
}

/// A wrapper running the observed proxy. The program it started leads a process group of its
/// own, which the wrapper's group kill does not reach: dropping this kills the program too.
pub struct Proxy(Wrapper);

impl Proxy {
    pub fn start(vars: &[(String, String)]) -> Proxy {
        Proxy(Wrapper::start(vars))
    }
}

impl std::ops::Deref for Proxy {
    type Target = Wrapper;
    fn deref(&self) -> &Wrapper {
        &self.0
    }
}

impl std::ops::DerefMut for Proxy {
    fn deref_mut(&mut self) -> &mut Wrapper {
        &mut self.0
    }
}

/// A finished one-shot run of the wrapper.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Starts the wrapper with `args` and `vars` (on top of the test's environment).
pub fn spawn(args: &[&str], vars: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Child::spawn(&mut cmd).expect("spawn runr-wrapper")
}

/// Waits for a spawned wrapper (up to `limit`) and collects its output.
pub fn finish(mut child: Child, limit: Duration) -> Run {
    // Read both pipes while waiting, so a chatty run cannot block on a full pipe.
    let mut out = child.inner().stdout.take().unwrap();
    let mut err = child.inner().stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = child.wait_timeout(limit);
    child.kill();
    Run {
        code: status.code().expect("exited by a signal"),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

pub fn run(args: &[&str], vars: &[(&str, String)], limit: Duration) -> Run {
    finish(spawn(args, vars), limit)
}

/// One parsed access line.
#[derive(Debug)]
pub struct Access {
    pub trace_id: String,
    pub span_id: String,
    pub sampled: bool,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub ms: f64,
    pub cold_start: bool,
}

/// The access lines in `log`, each checked against the spec's exact shape.
pub fn access_lines(log: &str) -> Vec<Access> {
    log.lines()
        .filter(|l| l.starts_with("[runr-wrapper] trace_id="))
        .map(|l| {
            let t: Vec<&str> = l.split(' ').collect();
            assert_eq!(t.len(), 9, "access line shape: {l:?}");
            let field = |i: usize, key: &str| {
                t[i].strip_prefix(key)
                    .unwrap_or_else(|| panic!("{key} in {l:?}"))
                    .to_string()
            };
            let hex = |s: &str, n: usize| {
                s.len() == n
                    && s.bytes()
                        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            };
            let trace_id = field(1, "trace_id=");
            let span_id = field(2, "span_id=");
            assert!(hex(&trace_id, 32) && hex(&span_id, 16), "{l:?}");
            let ms = t[7]
                .strip_suffix("ms")
                .unwrap_or_else(|| panic!("ms in {l:?}"));
            let decimals = ms.split_once('.').map(|(_, d)| d.len());
            assert_eq!(decimals, Some(1), "one decimal: {l:?}");
            Access {
                trace_id,
                span_id,
                sampled: field(3, "sampled=").parse().unwrap(),
                method: t[4].to_string(),
                path: t[5].to_string(),
                status: t[6].parse().unwrap(),
                ms: ms.parse().unwrap(),
                cold_start: field(8, "cold_start=").parse().unwrap(),
            }
        })
        .collect()
}

/// The test OTLP/HTTP collector, shared with runr-queue's tests.
pub use runr_testkit::otlp::{attr, Collector};

/// The capture lines of a replay file, once there are at least `n`.
pub fn replay_lines(path: &std::path::Path, n: usize) -> Vec<serde_json::Value> {
    runr_testkit::wait_for(
        &format!("{n} replay lines in {}", path.display()),
        Duration::from_secs(30),
        || {
            let text = std::fs::read_to_string(path).ok()?;
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).expect("each capture is one JSON line"))
                .collect();
            (lines.len() >= n).then_some(lines)
        },
    )
}

/// Peak resident memory of `pid` in KiB (VmHWM).
pub fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}
