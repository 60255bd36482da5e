//! Support for the lambda-mode tests: the wrapper started in a function's task root, the real
//! Lambda clients the functions run on (awslambdaric from PyPI, the lambda_runtime and
//! lambda_http crates built once per test run, a shell bootstrap with curl, a raw-socket Python
//! runtime for the protocol's corners), and a reader for streamed (chunked) answers that sees
//! each chunk as it arrives.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::support::{bin, children_of, Wrapper};

/// The python3 the tests run functions with (awslambdaric, aws-lambda-powertools and mangum
/// installed from tests/requirements.txt).
pub const PYTHON: &str = "python3";

/// A lambda-mode wrapper whose function lives in a task root of its own. The runtimes lead
/// process groups of their own, which the wrapper's group kill does not reach: dropping this
/// kills them too.
pub struct Function {
    pub wrapper: Wrapper,
    pub root: tempfile::TempDir,
}

impl Function {
    /// Writes `files` into a fresh task root and starts the wrapper there (the working
    /// directory is `LAMBDA_TASK_ROOT` when /app/code does not exist) with `vars`.
    pub fn start(files: &[(&str, &str)], vars: &[(&str, &str)]) -> Function {
        let root = tempfile::Builder::new()
            .prefix("runr-lambda-")
            .tempdir()
            .unwrap();
        for (name, text) in files {
            let path = root.path().join(name);
            std::fs::write(&path, text).unwrap();
            if name.ends_with("bootstrap") || name.ends_with(".sh") {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        let mut all = vec![("RUNR_WRAPPER_MODE".to_string(), "lambda".to_string())];
        all.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut cmd = Command::new(bin());
        cmd.current_dir(root.path());
        let wrapper = Wrapper::start_with(cmd, &all);
        Function { wrapper, root }
    }

    /// Waits until a runtime is initialised (the probe answers 200): tests with a short
    /// `RUNR_TIMEOUT` must not count a runtime's start-up against their first invocation.
    pub fn wait_ready(&self) {
        runr_testkit::wait_for("a ready runtime", Duration::from_secs(60), || {
            let probe = self.send("GET", "/", &[("K-Network-Probe", "queue")], b"");
            (probe.status == 200).then_some(())
        });
    }

    /// Waits until `n` runtimes have asked for an invocation (their first `/next`), so tests
    /// that count on every runtime being up do not race their start.
    pub fn wait_runtimes(&self, n: usize) {
        runr_testkit::wait_for(
            &format!("{n} runtimes polling"),
            Duration::from_secs(60),
            || {
                let log = self.log();
                let polled = (0..16)
                    .filter(|slot| {
                        log.contains(&format!(
                            "runtime api slot={slot} method=GET path=/2018-06-01/runtime/invocation/next"
                        ))
                    })
                    .count();
                (polled >= n).then_some(())
            },
        );
    }
}

impl std::ops::Deref for Function {
    type Target = Wrapper;
    fn deref(&self) -> &Wrapper {
        &self.wrapper
    }
}

impl std::ops::DerefMut for Function {
    fn deref_mut(&mut self) -> &mut Wrapper {
        &mut self.wrapper
    }
}

impl Drop for Function {
    fn drop(&mut self) {
        for (pid, _) in children_of(self.wrapper.child.pid() as i32) {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// `RUNR_COMMAND` for a Python function run by awslambdaric: `python3 -m awslambdaric <handler>`.
pub fn awslambdaric(handler: &str) -> String {
    serde_json::to_string(&[PYTHON, "-m", "awslambdaric", handler]).unwrap()
}

/// Fails the test with the install line when a Python package is missing.
pub fn require_python(module: &str) {
    let ok = Command::new(PYTHON)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "python module {module} is missing: python3 -m pip install -r tests/requirements.txt"
    );
}

/// The Rust Lambda function (wrapper/tests/fixtures/lambda-rust: lambda_runtime and
/// lambda_http from crates.io), built once per test run (`cargo build --release`, its own
/// target directory under this build's target/tmp; cargo's lock serialises concurrent test
/// processes and a second build is a no-op).
pub fn rust_function() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let manifest =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lambda-rust/Cargo.toml");
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("lambda-rust");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .args([
                "build",
                "--release",
                "--locked",
                "--quiet",
                "--manifest-path",
            ])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .output()
            .expect("run cargo");
        assert!(
            out.status.success(),
            "building the lambda_runtime fixture failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        target.join("release/lambda-rust-fixture")
    })
}

/// `RUNR_COMMAND` of the Rust function.
pub fn rust_command() -> String {
    serde_json::to_string(&[rust_function().to_string_lossy()]).unwrap()
}

// === reading a streamed answer ===

/// An answer read as it arrives: the head first, then one chunk at a time.
pub struct Stream {
    reader: BufReader<TcpStream>,
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Stream {
    /// Sends `GET path` and reads the answer's head.
    pub fn get(addr: SocketAddr, path: &str) -> Stream {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
        let mut reader = BufReader::new(s);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            headers.push((k.trim().to_lowercase(), v.trim().to_string()));
        }
        Stream {
            reader,
            status,
            headers,
        }
    }

    /// Every value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The next chunk of the chunked body: `Ok(None)` after the last chunk, `Err` when the
    /// connection ended without one (an answer cut off).
    pub fn chunk(&mut self) -> Result<Option<Vec<u8>>, String> {
        let mut size = String::new();
        let n = self
            .reader
            .read_line(&mut size)
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the connection closed before the last chunk".into());
        }
        let len = usize::from_str_radix(size.trim(), 16)
            .map_err(|_| format!("bad chunk size line {size:?}"))?;
        if len == 0 {
            let mut end = String::new();
            self.reader.read_line(&mut end).map_err(|e| e.to_string())?;
            return Ok(None);
        }
        let mut data = vec![0; len + 2];
        self.reader
            .read_exact(&mut data)
            .map_err(|e| format!("chunk of {len}: {e}"))?;
        data.truncate(len);
        Ok(Some(data))
    }

    /// Reads chunks until `want` bytes have come (chunk boundaries are the transport's).
    pub fn read_exact(&mut self, want: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while out.len() < want {
            match self.chunk() {
                Ok(Some(c)) => out.extend_from_slice(&c),
                other => panic!("wanted {want} bytes, got {out:?} then {other:?}"),
            }
        }
        out
    }
}
