//! The real `runr-image-upload serve`, started by `testkit::Server` with `PORT=0` (the test reads
//! the bound port from its `listening` line), and requests through `testkit::http`, whose
//! answers are read here as JSON.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
pub use runr_testkit::http::Body;
use runr_testkit::http::{self, Resp};
use runr_testkit::{wait_for, Server};
use serde_json::Value;

/// The receiver binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_runr-image-upload");

/// A target no test pushes to successfully (nothing listens on port 9 of loopback).
pub const NO_REGISTRY: &str = "127.0.0.1:9/runr-uploads/test/app:1";

/// Hex SHA-256 of `data` (through `sha256sum`, a tool independent of the code under test).
pub fn sha256_hex(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum");
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().expect("sha256sum output");
    writer.join().unwrap().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

pub use runr_testkit::{work_dir, KIB, MIB};

/// Deterministic pseudo-random bytes, so failures reproduce.
pub use runr_testkit::random::bytes as random_bytes;

/// A running receiver and the environment it was started with.
pub struct Receiver {
    /// `None` between [`Receiver::kill9`] and [`Receiver::restart`].
    server: Option<Server>,
    /// Where it listens (a new port after every restart).
    pub addr: SocketAddr,
    /// Its `RUNR_UPLOAD_DIR`.
    pub dir: PathBuf,
    env: HashMap<String, String>,
    log: PathBuf,
}

impl Receiver {
    /// Starts a receiver for `data` (size and digest declared from it) in `dir`.
    pub fn for_data(dir: &Path, data: &[u8], extra: &[(&str, &str)]) -> Receiver {
        let size = data.len().to_string();
        let sum = sha256_hex(data);
        let mut env: HashMap<String, String> = [
            ("RUNR_UPLOAD_SIZE", size.as_str()),
            ("RUNR_UPLOAD_SHA256", sum.as_str()),
            ("RUNR_UPLOAD_TARGET", NO_REGISTRY),
            ("RUNR_REGISTRY_PLAIN_HTTP", "1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for (k, v) in extra {
            env.insert(k.to_string(), v.to_string());
        }
        Receiver::start(dir, env)
    }

    /// Starts a receiver with `env` (plus `RUNR_UPLOAD_DIR`, and `PORT=0`) and waits for its
    /// `listening` line.
    pub fn start(dir: &Path, env: HashMap<String, String>) -> Receiver {
        let log = dir.parent().expect("a parent").join("receiver.log");
        let mut r = Receiver {
            server: None,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            dir: dir.to_path_buf(),
            env,
            log,
        };
        r.restart();
        r
    }

    /// SIGKILL, then a new receiver on the same directory and environment (a new port).
    pub fn kill9_and_restart(&mut self) {
        self.kill9();
        self.restart();
    }

    /// SIGKILL, and waits until the process is gone.
    pub fn kill9(&mut self) {
        self.signal(Signal::SIGKILL);
        self.wait_exit(Duration::from_secs(10));
        self.server = None;
    }

    /// A new receiver on the same directory and environment (a new port).
    pub fn restart(&mut self) {
        assert!(self.server.is_none(), "the receiver still runs");
        let mut cmd = Command::new(BIN);
        cmd.env_clear()
            .env("RUNR_UPLOAD_DIR", &self.dir)
            .envs(&self.env);
        let server = Server::start(cmd, &self.log);
        self.addr = server.addr;
        self.server = Some(server);
        let (code, body) = request(self.addr, "GET", "/healthz", &[], Body::None);
        assert_eq!(code, 200, "{body}");
    }

    /// Sends `sig` to the receiver.
    pub fn signal(&self, sig: Signal) {
        self.server().child.signal(sig);
    }

    /// Waits for the receiver to exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let server = self.server.as_mut().expect("the receiver runs");
        server.child.wait_timeout(timeout)
    }

    /// The receiver's process id.
    pub fn pid(&self) -> u32 {
        self.server().child.pid()
    }

    /// Its peak resident set (`VmHWM` of /proc), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/<pid>/status")
    }

    /// CPU time the receiver used so far (user + system), from /proc.
    pub fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        // USER_HZ is 100 on Linux (what /proc reports in).
        Duration::from_millis(ticks * 10)
    }

    fn server(&self) -> &Server {
        self.server.as_ref().expect("the receiver runs")
    }

    /// The receiver's log so far (every run of it).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET /status`.
    pub fn status(&self) -> Value {
        let (code, body) = request(self.addr, "GET", "/status", &[], Body::None);
        assert_eq!(code, 200, "{body}");
        body
    }

    /// `PUT /chunk?offset=N` with `data` and a Content-Length.
    pub fn put(&self, offset: u64, data: &[u8]) -> (u16, Value) {
        let path = format!("/chunk?offset={offset}");
        request(self.addr, "PUT", &path, &[], Body::Sized(data))
    }

    /// `PUT /chunk?offset=N` with `data`, chunked transfer encoding (no Content-Length).
    pub fn put_chunked(&self, offset: u64, data: &[u8]) -> (u16, Value) {
        let path = format!("/chunk?offset={offset}");
        request(self.addr, "PUT", &path, &[], Body::Chunked(data))
    }

    /// `POST /complete`.
    pub fn complete(&self) -> (u16, Value) {
        request(self.addr, "POST", "/complete", &[], Body::None)
    }

    /// Polls `/status` until `pred` holds.
    pub fn wait_status(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        wait_for(what, Duration::from_secs(60), || {
            let s = self.status();
            pred(&s).then_some(s)
        })
    }

    /// The `/status` that ends the push: `completed` or `failed`.
    pub fn finished(&self) -> Value {
        self.wait_status("the push to end", |s| {
            s["status"] == "completed" || s["status"] == "failed"
        })
    }

    /// `POST /complete` (accepted), then the push's end, which must be `completed`.
    pub fn completed(&self) -> Value {
        assert_eq!(self.complete().0, 202);
        let s = self.finished();
        assert_eq!(s["status"], "completed", "{s}\n{}", self.log());
        s
    }

    /// The data file as the receiver wrote it.
    pub fn data_file(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("upload.data")).unwrap()
    }
}

/// One request on its own connection; the status and the JSON body of the answer.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Body<'_>,
) -> (u16, Value) {
    json(&http::request(addr, method, path, headers, body))
}

/// Sends only a request head (no body follows) and reads the answer: proves the server decided
/// from the headers alone.
pub fn request_head_only(addr: SocketAddr, head: &str) -> (u16, Value) {
    json(&http::send_raw(addr, head.as_bytes()))
}

/// The status and JSON body of an answer, which must say how long it is.
pub fn json(resp: &Resp) -> (u16, Value) {
    assert!(
        resp.header("content-length").is_some(),
        "a Content-Length: {resp:?}"
    );
    let value = serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", resp.text()));
    (resp.status, value)
}

/// `image` as an `oci-archive` (what skopeo and buildah write), made by skopeo in `dir`.
pub fn oci_archive(image: &runr_testkit::oci::TestImage, dir: &Path) -> Vec<u8> {
    let path = dir.join("image.tar");
    let out = runr_testkit::tools::skopeo_output(&[
        "copy",
        "--preserve-digests",
        &image.oci_ref(),
        &format!("oci-archive:{}:{}", path.display(), image.tag),
    ]);
    assert!(out.success(), "{out:?}");
    std::fs::read(path).unwrap()
}

/// Pulls `reference` back with skopeo (`args` before the source: TLS and credential options)
/// and checks every blob of `image` came back byte for byte.
pub fn pulled_whole(reference: &str, image: &runr_testkit::oci::TestImage, args: &[&str]) {
    let out_dir = tempfile::tempdir().unwrap();
    let mut all = vec!["copy", "--retry-times", "0"];
    all.extend_from_slice(args);
    let src = format!("docker://{reference}");
    let dest = format!("dir:{}", out_dir.path().display());
    all.extend_from_slice(&[src.as_str(), dest.as_str()]);
    let out = runr_testkit::tools::skopeo_output(&all);
    assert!(out.success(), "{out:?}");
    for blob in image.blobs() {
        let hex = blob.digest.strip_prefix("sha256:").unwrap();
        let got = std::fs::read(out_dir.path().join(hex)).unwrap();
        assert!(got == blob.data, "{} differs", blob.digest);
    }
}

/// [`pulled_whole`] of `repo:1` in the plain-HTTP test registry `reg`.
pub fn pulled_from(reg: &runr_testkit::Registry, repo: &str, image: &runr_testkit::oci::TestImage) {
    let reference = format!("{}/{repo}:1", reg.host());
    pulled_whole(&reference, image, &["--src-tls-verify=false"]);
}
