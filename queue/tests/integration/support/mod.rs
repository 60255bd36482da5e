//! Test support: the real runr-queue binary, the real runr-wrapper in exec mode, the Python
//! CloudEvents receiver, and a real redis-server (testkit).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use runr_testkit::redis::Redis;
use runr_testkit::{wait_for, Child, Server};
use serde_json::Value;

/// Generous: the machine running the tests may be loaded.
pub const LONG: Duration = Duration::from_secs(60);

pub const STREAM: &str = "orders";
pub const GROUP: &str = "orders-api";
pub const SOURCE: &str = "/redisstream/orders/orders-api";
pub const DLQ: &str = "orders-dlq";

/// The spec's Bash handler ("Write your own runtime"), byte for byte.
pub const SPEC_HANDLER: &str = r#"#!/usr/bin/env bash
set -euo pipefail
case "${RUNR_TRIGGER:-http}" in
  schedule) echo "tick from bash" ;;
  queue)    printf 'processed %s (from bash)' "$(cat)" ;;
  *)        printf 'Hello from bash! You called %s %s' "$RUNR_METHOD" "$RUNR_PATH" ;;
esac
"#;

/// A temporary directory for one test's files.
pub fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("runr-queue-test-")
        .tempdir()
        .unwrap()
}

// === the consumer ===

/// A running runr-queue.
pub struct Consumer {
    pub child: Child,
    log: PathBuf,
}

/// The environment every test consumer starts from: this Redis, the standard stream and group.
pub fn base_env(redis: &Redis, target: &str, name: &str) -> Vec<(String, String)> {
    [
        ("RUNR_QUEUE_REDIS_URL", redis.url()),
        ("RUNR_QUEUE_STREAM", STREAM.to_string()),
        ("RUNR_QUEUE_GROUP", GROUP.to_string()),
        ("RUNR_QUEUE_CONSUMER", name.to_string()),
        ("RUNR_QUEUE_TARGET", target.to_string()),
        ("RUNR_QUEUE_LOG", "debug".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// `vars` with `extra` set (replacing what is there).
pub fn with(mut vars: Vec<(String, String)>, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    for (k, v) in extra {
        vars.retain(|(n, _)| n != k);
        vars.push((k.to_string(), v.to_string()));
    }
    vars
}

/// The binary under test, with nothing of the test's environment but PATH.
pub fn command(vars: &[(String, String)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_runr-queue"));
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(vars.iter().map(|(k, v)| (k, v)));
    cmd
}

impl Consumer {
    /// Starts runr-queue with `vars`, logging to `<dir>/<name>.log`, and waits until it consumes.
    pub fn start(dir: &Path, name: &str, vars: &[(String, String)]) -> Consumer {
        let mut c = Self::spawn(dir, name, vars);
        c.wait_log("consuming");
        c
    }

    /// Starts it without waiting for anything.
    pub fn spawn(dir: &Path, name: &str, vars: &[(String, String)]) -> Consumer {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut cmd = command(vars);
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        Consumer {
            child: Child::spawn(&mut cmd).expect("spawn runr-queue"),
            log,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle` (panics with the log if the process exits first).
    pub fn wait_log(&mut self, needle: &str) {
        let log = self.log.clone();
        let child = &mut self.child;
        wait_for(&format!("{needle:?} in the consumer's log"), LONG, || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains(needle) {
                return Some(());
            }
            if let Ok(Some(status)) = child.inner().try_wait() {
                panic!("runr-queue exited ({status}) before logging {needle:?}:\n{text}");
            }
            None
        });
    }

    /// SIGTERM, then the exit status (within `timeout`).
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.child.signal(Signal::SIGTERM);
        self.child.wait_timeout(timeout)
    }

    /// SIGTERM with nothing left in flight: exit 0 after a complete drain, not at the drain
    /// limit (the `stopped` line says which; no clock needed).
    pub fn stop_cleanly(&mut self) {
        let status = self.terminate(LONG);
        assert!(status.success(), "{status}:\n{}", self.log());
        let log = self.log();
        assert!(log.contains("] INFO stopped delivered="), "{log}");
        assert!(!log.contains("drain limit"), "{log}");
    }

    /// Waits until `n` entries were logged as delivered (the line follows the ack: it carries
    /// the start of the answer's body, read after the ack was sent).
    pub fn wait_delivered(&self, n: usize) -> Vec<(String, u32, String)> {
        wait_for(&format!("{n} delivered lines"), LONG, || {
            let d = self.delivered();
            (d.len() >= n).then_some(d)
        })
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.inner().try_wait(), Ok(None))
    }

    /// Lines of the log containing `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// `(id, attempt, answer)` of every `delivered` debug line.
    pub fn delivered(&self) -> Vec<(String, u32, String)> {
        self.lines_with(" delivered ")
            .iter()
            .map(|l| {
                let id = field(l, "id").expect("id");
                let attempt = field(l, "attempt").expect("attempt").parse().unwrap();
                let answer = field(l, "answer").unwrap_or_default();
                (id, attempt, answer)
            })
            .collect()
    }
}

/// The value of `name=value` in a log line, unquoted (the line read by the reference logfmt
/// reader, which also checks that it parses).
pub fn field(line: &str, name: &str) -> Option<String> {
    let pairs = runr_testkit::logfmt::parse(line).unwrap_or_else(|e| panic!("{e}"));
    runr_testkit::logfmt::values(&pairs, name)
        .first()
        .map(|v| v.to_string())
}

// === the wrapper ===

/// The real runr-wrapper in exec mode, raw input, queue trigger, running `handler` with bash.
pub fn wrapper(dir: &Path, handler: &str, extra: &[(&str, &str)]) -> Server {
    let script = dir.join("main.sh");
    std::fs::write(&script, handler).unwrap();
    let mut cmd = Command::new(runr_testkit::workspace_bin("runr-wrapper"));
    cmd.env("RUNR_WRAPPER_MODE", "exec")
        .env(
            "RUNR_COMMAND",
            serde_json::to_string(&["bash", script.to_str().unwrap()]).unwrap(),
        )
        .env("RUNR_INPUT", "raw")
        .env("RUNR_TRIGGER", "queue")
        .env("RUNR_TIMEOUT", "30")
        .envs(extra.iter().copied());
    Server::start(cmd, &dir.join("wrapper.log"))
}

// === the receiver ===

/// A file the receiver's `--hold-while` waits on: requests are held while it exists.
pub struct Gate(PathBuf);

impl Gate {
    /// A closed gate in `dir`.
    pub fn closed(dir: &Path, name: &str) -> Gate {
        let path = dir.join(format!("{name}.gate"));
        std::fs::write(&path, b"").unwrap();
        Gate(path)
    }

    /// The receiver's arguments that hold requests at this gate.
    pub fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }

    /// Lets every held request (and every later one) through.
    pub fn open(&self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The Python CloudEvents receiver.
pub struct Receiver {
    pub server: Server,
    records: PathBuf,
    /// Records parsed so far and the file offset after them (the file only grows).
    seen: std::cell::RefCell<(u64, Vec<Value>)>,
}

impl Receiver {
    /// Starts `receiver.py` with `args` (see its docstring).
    pub fn start(dir: &Path, args: &[&str]) -> Receiver {
        let records = dir.join(format!(
            "receiver-{}.jsonl",
            args.join("_").replace('/', "")
        ));
        let mut cmd = Command::new("python3");
        cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/receiver.py"))
            .arg("--log")
            .arg(&records)
            .args(["--source", SOURCE])
            .args(args);
        let log = dir.join("receiver.log");
        let server = Server::start(cmd, &log);
        Receiver {
            server,
            records,
            seen: Default::default(),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.server.addr)
    }

    /// Every complete record so far (a line still being written is left for the next call).
    pub fn records(&self) -> Vec<Value> {
        self.with_records(<[Value]>::to_vec)
    }

    /// Runs `f` over every complete record so far, without copying them.
    pub fn with_records<T>(&self, f: impl FnOnce(&[Value]) -> T) -> T {
        use std::io::{Read, Seek};
        let mut seen = self.seen.borrow_mut();
        if let Ok(mut f) = std::fs::File::open(&self.records) {
            let mut fresh = Vec::new();
            if f.seek(std::io::SeekFrom::Start(seen.0)).is_ok() && f.read_to_end(&mut fresh).is_ok()
            {
                let complete = fresh.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
                for line in fresh[..complete]
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                {
                    seen.1
                        .push(serde_json::from_slice(line).expect("a JSON record"));
                }
                seen.0 += complete as u64;
            }
        }
        f(&seen.1)
    }

    /// Records of one phase (`start` or `end`).
    pub fn phase(&self, phase: &str) -> Vec<Value> {
        self.with_records(|all| {
            all.iter()
                .filter(|r| r["phase"] == phase)
                .cloned()
                .collect()
        })
    }

    /// Ids answered 200 (and written), with how many times.
    pub fn succeeded(&self) -> BTreeMap<String, usize> {
        self.with_records(|all| {
            let mut out = BTreeMap::new();
            for r in all.iter().filter(|r| r["phase"] == "end") {
                if r["status"] == 200 && r["written"] == true {
                    *out.entry(r["id"].as_str().unwrap().to_string())
                        .or_default() += 1;
                }
            }
            out
        })
    }

    /// Panics when any delivery had a problem the receiver saw.
    pub fn assert_no_problems(&self) {
        for r in self.phase("start") {
            assert_eq!(r["problems"], serde_json::json!([]), "bad delivery: {r}");
        }
    }

    /// Waits until `n` deliveries started.
    pub fn wait_started(&self, n: usize) {
        wait_for(&format!("{n} deliveries to start"), LONG, || {
            let started =
                self.with_records(|all| all.iter().filter(|r| r["phase"] == "start").count());
            (started >= n).then_some(())
        });
    }
}

// === Redis helpers ===

/// Waits until `ids` were all answered 200 by `receiver` and nothing is pending in the group.
pub fn wait_all_acked(redis: &Redis, receiver: &Receiver, ids: &[String]) {
    let mut conn = redis.conn();
    wait_for("every entry answered 200 and acknowledged", LONG, || {
        let ok = receiver.succeeded();
        (ok.len() >= ids.len()
            && ids.iter().all(|id| ok.contains_key(id))
            && conn.pending(STREAM, GROUP) == 0)
            .then_some(())
    });
}

/// Creates the group at `0` (so entries added before a consumer starts are read), and the stream.
pub fn create_group(redis: &Redis) {
    let r = redis
        .conn()
        .cmd_str(&["XGROUP", "CREATE", STREAM, GROUP, "0", "MKSTREAM"]);
    assert_eq!(r, runr_testkit::redis::Reply::Simple("OK".into()));
}

/// The JSON body the consumer must send for `fields`: serde_json's escaping of each string.
pub fn expected_body(fields: &[(&str, &str)]) -> String {
    let mut s = String::from("{");
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&serde_json::to_string(k).unwrap());
        s.push(':');
        s.push_str(&serde_json::to_string(v).unwrap());
    }
    s.push('}');
    s
}

/// Lower-case hex SHA-256.
pub fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(data);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
