//! Test support: start the real runr-wrapper binary on a free port, a tiny blocking HTTP/1.1
//! client, and handler fixtures (bash, python3 and C programs built once per test run).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use runr_testkit::{free_port, wait_for, Child};

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_runr-wrapper")
}

/// A running wrapper whose stderr goes to a file the test can read.
pub struct Wrapper {
    pub child: Child,
    pub port: u16,
    log: PathBuf,
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
    /// Starts the wrapper with `vars` (plus PORT) and waits until it accepts connections.
    pub fn start(vars: &[(String, String)]) -> Wrapper {
        Self::start_with(Command::new(bin()), vars)
    }

    /// Like [`Wrapper::start`] but runs `cmd` (e.g. `unshare ... runr-wrapper`).
    pub fn start_with(mut cmd: Command, vars: &[(String, String)]) -> Wrapper {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("wrapper.log");
        let port = free_port();
        cmd.env("PORT", port.to_string())
            .env("RUNR_LOG", "debug")
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let mut w = Wrapper {
            child: Child::spawn(&mut cmd).expect("spawn runr-wrapper"),
            port,
            log,
            _dir: dir,
        };
        let addr = w.addr();
        wait_for("the wrapper to listen", Duration::from_secs(20), || {
            if let Ok(Some(status)) = w.child.inner().try_wait() {
                panic!("runr-wrapper exited with {status}:\n{}", w.log());
            }
            TcpStream::connect_timeout(&addr, Duration::from_millis(100))
                .ok()
                .map(|_| ())
        });
        w
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Everything the wrapper wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle`.
    pub fn wait_log(&self, needle: &str) {
        wait_for(
            &format!("{needle:?} in the log"),
            Duration::from_secs(30),
            || self.log().contains(needle).then_some(()),
        );
    }

    pub fn get(&self, path: &str) -> Resp {
        self.send("GET", path, &[], b"")
    }

    pub fn post(&self, path: &str, body: &[u8]) -> Resp {
        self.send("POST", path, &[], body)
    }

    pub fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        Conn::open(self.addr()).send(method, path, headers, body)
    }
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// All values of header `name`.
    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The `error` field of a JSON error answer.
    pub fn error(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// One keep-alive HTTP/1.1 connection (answers are framed by Content-Length, which the wrapper
/// always sends).
pub struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).expect("connect to the wrapper");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            reader: BufReader::new(s),
        }
    }

    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Resp {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        let s = self.reader.get_mut();
        s.write_all(req.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        self.read_response()
    }

    pub fn read_response(&mut self) -> Resp {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("read status line");
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_else(|| panic!("bad status line {line:?}"))
            .parse()
            .unwrap();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            self.reader.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().unwrap())
            .unwrap_or(0);
        let mut body = vec![0; len];
        self.reader.read_exact(&mut body).unwrap();
        Resp {
            status,
            headers,
            body,
        }
    }

    /// The raw socket, for tests that write by hand.
    pub fn stream(&mut self) -> &mut TcpStream {
        self.reader.get_mut()
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
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/c");
        for name in ["echo_worker", "forker"] {
            let out = Command::new("cc")
                .args(["-O2", "-o"])
                .arg(dir.join(name))
                .arg(examples.join(format!("{name}.c")))
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
        // /exit, sleeps on /sleep?s=N, answers a huge line on /huge, leaves a grandchild on /gc.
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
                    let r = conn.send("POST", &path, &[], b"ping");
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
