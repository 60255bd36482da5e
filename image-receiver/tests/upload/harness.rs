//! The real `runr-image-upload serve` on a free loopback port, and a tiny HTTP/1.1 client that
//! can send what the tests need (a Content-Length without a body, chunked bodies).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use runr_testkit::{free_port, wait_for, Child};
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

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A running receiver and the environment it was started with.
pub struct Receiver {
    pub child: Child,
    pub addr: SocketAddr,
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

    /// Starts a receiver with `env` (plus PORT and RUNR_UPLOAD_DIR) and waits until it answers.
    pub fn start(dir: &Path, mut env: HashMap<String, String>) -> Receiver {
        env.entry("PORT".into())
            .or_insert_with(|| free_port().to_string());
        let log = dir.parent().expect("a parent").join("receiver.log");
        let mut r = Receiver {
            child: spawn(dir, &env, &log),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            dir: dir.to_path_buf(),
            env,
            log,
        };
        r.wait_ready();
        r
    }

    fn wait_ready(&mut self) {
        let port: u16 = self.env["PORT"].parse().unwrap();
        self.addr = SocketAddr::from(([127, 0, 0, 1], port));
        let addr = self.addr;
        let child = &mut self.child;
        let log = &self.log;
        wait_for(
            "the receiver to answer /healthz",
            Duration::from_secs(20),
            || {
                if let Ok(Some(status)) = child.inner().try_wait() {
                    panic!(
                        "receiver exited with {status}: {}",
                        std::fs::read_to_string(log).unwrap_or_default()
                    );
                }
                let s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
                drop(s);
                (request(addr, "GET", "/healthz", &[], None).0 == 200).then_some(())
            },
        );
    }

    /// SIGKILL, then a new receiver on the same directory and environment (a new port).
    pub fn kill9_and_restart(&mut self) {
        self.kill9();
        self.restart();
    }

    /// SIGKILL, and waits until the process is gone.
    pub fn kill9(&mut self) {
        self.child.signal(Signal::SIGKILL);
        self.child.wait_timeout(Duration::from_secs(10));
    }

    /// A new receiver on the same directory and environment (a new port).
    pub fn restart(&mut self) {
        self.env.insert("PORT".into(), free_port().to_string());
        self.child = spawn(&self.dir, &self.env, &self.log);
        self.wait_ready();
    }

    /// The receiver's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET /status`.
    pub fn status(&self) -> Value {
        let (code, body) = request(self.addr, "GET", "/status", &[], None);
        assert_eq!(code, 200, "{body}");
        body
    }

    /// `PUT /chunk?offset=N` with `data` and a Content-Length.
    pub fn put(&self, offset: u64, data: &[u8]) -> (u16, Value) {
        request(
            self.addr,
            "PUT",
            &format!("/chunk?offset={offset}"),
            &[],
            Some(Body::Sized(data)),
        )
    }

    /// `PUT /chunk?offset=N` with `data`, chunked transfer encoding (no Content-Length).
    pub fn put_chunked(&self, offset: u64, data: &[u8]) -> (u16, Value) {
        request(
            self.addr,
            "PUT",
            &format!("/chunk?offset={offset}"),
            &[],
            Some(Body::Chunked(data)),
        )
    }

    /// `POST /complete`.
    pub fn complete(&self) -> (u16, Value) {
        request(self.addr, "POST", "/complete", &[], None)
    }

    /// Polls `/status` until `pred` holds.
    pub fn wait_status(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        wait_for(what, Duration::from_secs(60), || {
            let s = self.status();
            pred(&s).then_some(s)
        })
    }

    /// The data file as the receiver wrote it.
    pub fn data_file(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("upload.data")).unwrap()
    }
}

fn spawn(dir: &Path, env: &HashMap<String, String>, log: &Path) -> Child {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("RUNR_UPLOAD_DIR", dir)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    Child::spawn(&mut cmd).expect("spawn runr-image-upload")
}

/// A request body.
pub enum Body<'a> {
    /// With Content-Length.
    Sized(&'a [u8]),
    /// Transfer-Encoding: chunked, in 64 KiB pieces.
    Chunked(&'a [u8]),
}

/// One request on its own connection; the status and the JSON body of the answer.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Body<'_>>,
) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).expect("connect to the receiver");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    match &body {
        Some(Body::Sized(b)) => head.push_str(&format!("Content-Length: {}\r\n", b.len())),
        Some(Body::Chunked(_)) => head.push_str("Transfer-Encoding: chunked\r\n"),
        None if method != "GET" => head.push_str("Content-Length: 0\r\n"),
        None => {}
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // The body goes from its own thread while this one reads: a server that refuses early
    // answers and closes while we still send, and the answer must not be lost to a reset.
    let owned: Option<(bool, Vec<u8>)> = match body {
        Some(Body::Sized(b)) => Some((false, b.to_vec())),
        Some(Body::Chunked(b)) => Some((true, b.to_vec())),
        None => None,
    };
    let writer = owned.map(|(chunked, data)| {
        let mut w = s.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = if chunked {
                write_chunked(&mut w, &data)
            } else {
                w.write_all(&data)
            };
        })
    });
    let answer = read_response(&mut s);
    drop(s);
    if let Some(w) = writer {
        let _ = w.join();
    }
    answer
}

/// Sends only a request head (no body follows) and reads the answer: proves the server decided
/// from the headers alone.
pub fn request_head_only(addr: SocketAddr, head: &str) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).expect("connect to the receiver");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    read_response(&mut s)
}

fn write_chunked(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    for piece in data.chunks(64 * 1024) {
        write!(s, "{:x}\r\n", piece.len())?;
        s.write_all(piece)?;
        s.write_all(b"\r\n")?;
    }
    s.write_all(b"0\r\n\r\n")
}

/// Reads one response (status line, headers, Content-Length body) and parses the body as JSON.
pub fn read_response(s: &mut TcpStream) -> (u16, Value) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let header_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut tmp).expect("read the answer");
        assert!(n > 0, "connection closed before an answer: {buf:?}");
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
    let code: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .expect("a Content-Length");
    while buf.len() < header_end + len {
        let n = s.read(&mut tmp).expect("read the body");
        assert!(n > 0, "connection closed mid-body");
        buf.extend_from_slice(&tmp[..n]);
    }
    let body = &buf[header_end..header_end + len];
    let value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)));
    (code, value)
}
