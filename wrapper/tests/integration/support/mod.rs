//! Test support: start the real runr-wrapper binary (with `PORT=0`, reading the port it bound
//! from its `listening` line: [`runr_testkit::Server`]), requests through the shared raw
//! client ([`runr_testkit::http`]), and handler fixtures (bash, python3 and C programs built
//! once per test run).

pub mod observed;
pub mod telemetry;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub use runr_testkit::http::{Body, Conn, Resp};
use runr_testkit::Server;

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_runr-wrapper")
}

/// A running wrapper whose stdout and stderr go to a log file the test can read (through
/// [`Server`], which it derefs to: `child`, `log()`, `wait_log()`).
pub struct Wrapper {
    server: Server,
    _dir: tempfile::TempDir,
}

/// Environment for a wrapper: mode, command (JSON array) and extra variables.
pub fn env(mode: &str, command: &[&str]) -> Vec<(String, String)> {
    vec![
        ("RUNR_WRAPPER_MODE".into(), mode.into()),
        (
            "RUNR_COMMAND".into(),
            serde_json::to_string(command).unwrap(),
        ),
    ]
}

impl Wrapper {
    /// Starts the wrapper with `vars` on a port the kernel picks, and waits until it listens.
    pub fn start(vars: &[(String, String)]) -> Wrapper {
        Self::start_with(Command::new(bin()), vars)
    }

    /// Like [`Wrapper::start`] but runs `cmd` (e.g. `unshare ... runr-wrapper`).
    pub fn start_with(mut cmd: Command, vars: &[(String, String)]) -> Wrapper {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("wrapper.log");
        cmd.env("RUNR_LOG", "debug")
            .envs(vars.iter().map(|(k, v)| (k, v)));
        Wrapper {
            server: Server::start(cmd, &log),
            _dir: dir,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// GETs `path` until it answers 200 (a worker that starts slower than a short RUNR_TIMEOUT
    /// times out first on a loaded machine) and returns that answer.
    pub fn get_when_up(&self, path: &str) -> Resp {
        runr_testkit::wait_for(
            &format!("GET {path} to answer 200"),
            std::time::Duration::from_secs(60),
            || Some(self.get(path)).filter(|r| r.status == 200),
        )
    }

    pub fn get(&self, path: &str) -> Resp {
        self.send("GET", path, &[], b"")
    }

    pub fn post(&self, path: &str, body: &[u8]) -> Resp {
        self.send("POST", path, &[], body)
    }

    /// One request on a new connection; an empty `body` is sent as none.
    pub fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        let body = if body.is_empty() {
            Body::None
        } else {
            Body::Sized(body)
        };
        Conn::open(self.addr()).send(method, path, headers, body)
    }
}

impl std::ops::Deref for Wrapper {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}

impl std::ops::DerefMut for Wrapper {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.server
    }
}

impl Drop for Wrapper {
    /// The wrapper's children lead process groups of their own, which the SIGKILL of the
    /// wrapper's group does not reach, and a worker that ignores EOF and SIGTERM (as some
    /// fixtures do on purpose) would outlive the test. Stopped first, so the wrapper cannot
    /// start a replacement between the two kills.
    fn drop(&mut self) {
        use nix::sys::signal::{kill, killpg, Signal};
        use nix::unistd::Pid;
        // Only while it runs: the pid of a reaped wrapper may be another process's by now.
        if !matches!(self.server.child.inner().try_wait(), Ok(None)) {
            return;
        }
        let pid = self.server.child.pid() as i32;
        let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
        for (child, _) in children_of(pid) {
            let _ = killpg(Pid::from_raw(child), Signal::SIGKILL);
        }
    }
}

/// What the wrapper's answers are read as.
pub trait RespExt {
    /// The body as JSON (panics with the body when it is not).
    fn json(&self) -> serde_json::Value;
    /// The `error` field of a JSON error answer.
    fn error(&self) -> String;
}

impl RespExt for Resp {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    fn error(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// Handler fixtures, written and compiled once per test run into a directory that lives as
/// long as the test process.
pub struct Fixtures {
    pub dir: PathBuf,
}

impl Fixtures {
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }
}

/// The fixtures directory (scripts and compiled C programs).
pub fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("runr-wrapper-fixtures-")
            .tempdir()
            .unwrap()
            .keep();
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        // The examples' C programs, and the stress/admission/memory/soak handlers of
        // tests/fixtures.
        let examples = manifest.join("../examples/c");
        let own = manifest.join("tests/fixtures");
        for (src, name) in [
            (&examples, "echo_worker"),
            (&examples, "forker"),
            (&own, "stress_handler"),
            (&own, "stress_worker"),
        ] {
            let out = Command::new("cc")
                .args(["-O2", "-o"])
                .arg(dir.join(name))
                .arg(src.join(format!("{name}.c")))
                .output()
                .expect("run cc");
            assert!(
                out.status.success(),
                "cc {name}.c failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for (name, text) in SCRIPTS {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
        }
        Fixtures { dir }
    })
}

/// Test handlers: (file name, contents).
const SCRIPTS: &[(&str, &str)] = &[
    (
        // Exec: prints its RUNR_* variables as a JSON object (python for exact escaping).
        "env.py",
        r#"import json, os, sys
sys.stdin.read()
print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("RUNR_")}))
"#,
    ),
    (
        // Exec: answers the response shape named by ?shape=.
        "shapes.py",
        r#"import json, sys
req = json.load(sys.stdin)
shape = req["query"].get("shape", "")
out = {
    "text": {"statusCode": 201, "body": "created"},
    "html": {"statusCode": 200, "headers": {"Content-Type": "text/html"}, "body": "<b>x</b>"},
    "base64": {"statusCode": 200, "body": "/wD+", "isBase64Encoded": True},
    "json": {"statusCode": 202, "body": {"ok": True, "n": [1, 2]}},
    "headers": {"statusCode": 200, "headers": {"Set-Cookie": ["a=1", "b=2"], "X-Num": 7, "X-Bool": False}, "body": ""},
    "badstatus": {"statusCode": 1000, "body": "x"},
    "cors": {"statusCode": 200, "headers": {"Access-Control-Allow-Origin": "https://a.example"}, "body": "x"},
}.get(shape)
if shape == "rawtext":
    sys.stdout.write("just text")
elif shape == "rawjson":
    sys.stdout.write('[1, "two"]')
else:
    sys.stdout.write(json.dumps(out))
"#,
    ),
    (
        // Persistent: echoes path, worker slot and pid; prints a non-JSON line first; exits on
        // /exit, sleeps on /sleep?s=N, waits on /gate?file=F until F exists, answers a huge
        // line on /huge, leaves a grandchild on /gc.
        "worker.py",
        r#"import json, os, subprocess, sys, time
print("worker booting", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    path = req["path"]
    print("debug: got " + path, flush=True)
    if path == "/exit":
        sys.exit(3)
    if path == "/sleep":
        time.sleep(float(req["query"].get("s", "60")))
    if path == "/gate":
        while not os.path.exists(req["query"]["file"]):
            time.sleep(0.01)
    if path == "/gc":
        p = subprocess.Popen(["sleep", "60"])
        with open(req["query"]["file"], "w") as f:
            f.write(str(p.pid))
        time.sleep(60)
    if path == "/huge":
        sys.stdout.write('"' + "x" * (11 * 1024 * 1024) + '"\n')
        sys.stdout.flush()
        continue
    if path == "/string":
        print(json.dumps("plain string"), flush=True)
        continue
    body = {"path": path, "worker": os.environ.get("RUNR_WORKER"), "pid": os.getpid(),
            "body": req["body"], "exec_var": os.environ.get("RUNR_METHOD")}
    print(json.dumps({"statusCode": 200, "body": body}), flush=True)
"#,
    ),
    (
        // Persistent: exits at once, recording when it started (backoff test).
        "crash.sh",
        "#!/bin/bash\ndate +%s.%N >> \"$STARTS\"\nexit 1\n",
    ),
];

/// Starts `n` threads that each send `per` requests on one keep-alive connection and collect
/// the statuses.
pub fn load(addr: SocketAddr, threads: usize, per: usize, path: &str) -> HashMap<u16, usize> {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let path = path.to_string();
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                let mut counts = HashMap::new();
                for _ in 0..per {
                    let r = conn.send("POST", &path, &[], Body::Sized(b"ping"));
                    *counts.entry(r.status).or_insert(0) += 1;
                }
                counts
            })
        })
        .collect();
    let mut total = HashMap::new();
    for h in handles {
        for (k, v) in h.join().unwrap() {
            *total.entry(k).or_insert(0) += v;
        }
    }
    total
}

/// Byte `j` of the stream the C fixture handlers write (tests/fixtures/stress_*.c, and the
/// answers built from it).
pub fn pattern(j: u32) -> u8 {
    (j.wrapping_mul(2654435761) >> 24) as u8
}

/// True while process `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

/// The pids whose parent is `ppid`, with their state letter.
pub fn children_of(ppid: i32) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(1).and_then(|p| p.parse::<i32>().ok()) == Some(ppid) {
            out.push((pid, fields[0].to_string()));
        }
    }
    out
}

/// A `/proc/<pid>/status` field in KiB (`VmHWM`: peak RSS, `VmRSS`: RSS now).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A file the `/gate` handlers wait for (`GATE`): they hold their slot until it is opened.
pub struct Gate {
    dir: tempfile::TempDir,
}

impl Gate {
    pub fn new() -> Gate {
        Gate {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The variable that tells the handlers where the gate is.
    pub fn var(&self) -> (String, String) {
        ("GATE".into(), self.path().display().to_string())
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("open")
    }

    /// Lets every waiting handler go on.
    pub fn open(&self) {
        std::fs::write(self.path(), b"").unwrap();
    }
}
