//! Test harness shared by every crate of the workspace.
//!
//! Real parts, not mocks: [`Registry`] starts the CNCF distribution registry from Debian's
//! `docker-registry` package on a free loopback port with its storage in a temporary directory,
//! [`redis::Redis`] a real `redis-server` the same way (with a small RESP client),
//! [`Child`] owns a spawned process and kills it (by PID, whole group) when dropped, and every
//! wait is on a condition with a deadline, never a bare sleep.
//!
//! For the edges of a real registry: [`TokenRegistry`] (distribution's `auth: token` behind a
//! token service in this process), [`TlsRegistry`] (HTTPS with a test CA, and broken
//! certificates), [`RangeIgnoringCache`] (a cache that answers `Range` probes with the whole blob),
//! certificates in [`pki`], test images in [`oci`]. [`logfmt`] reads log lines back into their fields.

mod distribution;
pub mod http;
pub mod httpd;
pub mod logfmt;
pub mod oci;
pub mod otlp;
pub mod pki;
pub mod prom;
pub mod proxy;
pub mod random;
pub mod range_cache;
pub mod redis;
pub mod server;
pub mod tls;
pub mod token;
pub mod tools;

pub use range_cache::RangeIgnoringCache;
pub use server::Server;
pub use tls::{TlsRegistry, TlsVariant};
pub use token::TokenRegistry;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// A kibibyte, as the tests write sizes.
pub const KIB: usize = 1024;
/// A mebibyte.
pub const MIB: usize = 1024 * KIB;

/// A fresh directory for a test's files: `work` inside a temporary directory (so a test can
/// also create siblings of it, and a path that is not there yet), removed when the guard drops.
pub fn work_dir() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("create a temporary directory");
    let dir = tmp.path().join("work");
    std::fs::create_dir(&dir).expect("create the work directory");
    (tmp, dir)
}

/// A loopback port nobody listens on right now.
///
/// The port is released before returning, so another process could take it in between; tests
/// that hand it to a server check that the server actually bound it.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// Waits until `cond` returns `Some`, polling every few milliseconds, or panics with `what`
/// after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(2);
    loop {
        if let Some(v) = cond() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// True when nothing accepts connections on loopback `addr`. A connect to a free port in the
/// ephemeral range can pick that same port as its source and connect to itself (TCP's
/// simultaneous open), which a busy machine making many connections hits now and then: such a
/// connection is not a listener.
pub fn nothing_listens(addr: SocketAddr) -> bool {
    match TcpStream::connect(addr) {
        Err(_) => true,
        Ok(s) => s.local_addr().ok() == s.peer_addr().ok(),
    }
}

/// Waits until something accepts TCP connections on `addr`.
pub fn wait_for_port(addr: SocketAddr, timeout: Duration) {
    wait_for(&format!("a listener on {addr}"), timeout, || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(200))
            .ok()
            .map(|_| ())
    })
}

/// True when `name` is on PATH.
pub fn have_tool(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join(name).is_file()))
        .unwrap_or(false)
}

/// The file a `docker-registry` whose storage is `storage` keeps blob `digest` in.
pub fn stored_blob(storage: &Path, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    storage
        .join("docker/registry/v2/blobs/sha256")
        .join(&hex[..2.min(hex.len())])
        .join(hex)
        .join("data")
}

/// True when every tool in `names` is on PATH; otherwise prints which are missing, so the test
/// that calls it can skip with a line saying why.
pub fn tools_present(names: &[&str]) -> bool {
    let missing: Vec<&str> = names.iter().copied().filter(|n| !have_tool(n)).collect();
    if !missing.is_empty() {
        println!(
            "skipping: {} not installed (.ci/run installs them)",
            missing.join(", ")
        );
    }
    missing.is_empty()
}

/// True when a Docker engine answers `docker info`.
pub fn docker_available() -> bool {
    have_tool("docker")
        && Command::new("docker")
            .arg("info")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
}

/// The path of a binary built by this workspace (`cargo build` puts every member's binaries in
/// the same target directory), for tests that cross crates. A crate's own binary is better found
/// through `env!("CARGO_BIN_EXE_<name>")`.
pub fn workspace_bin(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let path = target.join(profile).join(name);
    assert!(
        path.is_file(),
        "{} is not built: run `cargo build --workspace` first",
        path.display()
    );
    path
}

// === impl Child ===

/// A spawned process that is killed, with its whole process group, when dropped.
///
/// Spawn it with [`Child::spawn`], which puts it into a new process group so that everything it
/// starts goes with it.
pub struct Child {
    inner: std::process::Child,
    killed: bool,
}

impl Child {
    /// Spawns `cmd` as the leader of a new process group.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<Child> {
        use std::os::unix::process::CommandExt;
        let inner = cmd.process_group(0).spawn()?;
        Ok(Child {
            inner,
            killed: false,
        })
    }

    /// The process id (also its process group id).
    pub fn pid(&self) -> u32 {
        self.inner.id()
    }

    /// The underlying std child, e.g. to take its pipes.
    pub fn inner(&mut self) -> &mut std::process::Child {
        &mut self.inner
    }

    /// Sends `sig` to the process (not its group).
    pub fn signal(&self, sig: Signal) {
        let _ = nix::sys::signal::kill(Pid::from_raw(self.inner.id() as i32), sig);
    }

    /// Waits for the process to exit, up to `timeout`; panics if it does not.
    pub fn wait_timeout(&mut self, timeout: Duration) -> ExitStatus {
        let pid = self.inner.id();
        let inner = &mut self.inner;
        wait_for(&format!("process {pid} to exit"), timeout, || {
            inner.try_wait().ok().flatten()
        })
    }

    /// Kills the whole process group with SIGKILL and reaps the leader.
    pub fn kill(&mut self) {
        if !self.killed {
            self.killed = true;
            let _ = killpg(Pid::from_raw(self.inner.id() as i32), Signal::SIGKILL);
            let _ = self.inner.kill();
            let _ = self.inner.wait();
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

// === impl Registry ===

/// A real CNCF distribution registry (`docker-registry` from Debian) on a free loopback port,
/// storing into a temporary directory that is removed on drop.
pub struct Registry {
    dist: distribution::Distribution,
    proxy: Option<String>,
    /// `user:password` the registry requires (htpasswd, basic auth), if any.
    basic_auth: Option<(String, String)>,
}

impl Registry {
    /// Starts a plain registry and waits until it answers `GET /v2/`.
    pub fn start() -> Registry {
        Self::start_with(None, None)
    }

    /// Starts a pull-through cache for `upstream` (e.g. `http://127.0.0.1:5000`).
    pub fn start_proxy(upstream: &str) -> Registry {
        Self::start_with(Some(upstream.to_string()), None)
    }

    /// Starts a plain registry that requires basic auth with `user` and `password`.
    pub fn start_with_basic_auth(user: &str, password: &str) -> Registry {
        Self::start_with(None, Some((user, password)))
    }

    /// Starts a pull-through cache for `upstream` that requires basic auth.
    pub fn start_proxy_with_basic_auth(upstream: &str, user: &str, password: &str) -> Registry {
        Self::start_with(Some(upstream.to_string()), Some((user, password)))
    }

    /// Starts a pull-through cache for `upstream` on a chosen loopback `port`, for tests whose
    /// client starts first (e.g. to check that it waits for the registry to come up). Get the
    /// port from [`free_port`]; while another socket holds it, the registry waits for it.
    pub fn start_proxy_on_port(upstream: &str, port: u16) -> Registry {
        let mut reg = Self::stopped(Some(upstream.to_string()), None);
        reg.dist.on_port(port);
        reg.start_first();
        reg
    }

    fn start_with(proxy: Option<String>, basic_auth: Option<(&str, &str)>) -> Registry {
        let mut reg = Self::stopped(proxy, basic_auth);
        reg.start_first();
        reg
    }

    fn stopped(proxy: Option<String>, basic_auth: Option<(&str, &str)>) -> Registry {
        if basic_auth.is_some() {
            assert!(
                have_tool("htpasswd"),
                "htpasswd is not installed (apt-get install apache2-utils; .ci/run does this)"
            );
        }
        let mut dist = distribution::Distribution::new("runr-registry-");
        dist.log_level("warn");
        Registry {
            dist,
            proxy,
            basic_auth: basic_auth.map(|(u, p)| (u.to_string(), p.to_string())),
        }
    }

    fn start_first(&mut self) {
        self.configure();
        self.dist.start();
    }

    /// Starts the registry again on the same port and storage (after [`Registry::stop`]).
    pub fn restart(&mut self) {
        self.configure();
        self.dist.restart();
    }

    /// The proxy and basic-auth sections of its configuration (the htpasswd file made anew).
    fn configure(&mut self) {
        let mut extra = match &self.proxy {
            Some(url) => format!("proxy:\n  remoteurl: {url}\n"),
            None => String::new(),
        };
        if let Some((user, password)) = &self.basic_auth {
            let htpasswd = self.dist.dir().join("htpasswd");
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, password])
                .output()
                .expect("run htpasswd");
            assert!(out.status.success(), "htpasswd failed: {out:?}");
            std::fs::write(&htpasswd, &out.stdout).expect("write htpasswd");
            extra.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: runr-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        self.dist.configure(extra, None);
    }

    /// Stops the registry (SIGKILL to its group); storage stays for [`Registry::restart`].
    pub fn stop(&mut self) {
        self.dist.stop();
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.dist.addr()
    }

    /// `127.0.0.1:<port>` as a string, the form image references and skopeo use.
    pub fn host(&self) -> String {
        self.addr().to_string()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The registry's storage root on disk (blobs under `docker/registry/v2/blobs`).
    pub fn storage(&self) -> PathBuf {
        self.dist.storage()
    }

    /// The registry's own log, for failure messages.
    pub fn log(&self) -> String {
        self.dist.log()
    }
}

/// A minimal blocking HTTP/1.0 GET that returns the status code, for readiness checks only.
pub fn http_get_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).ok()?;
    let head = std::str::from_utf8(&buf[..n]).ok()?;
    head.split_whitespace().nth(1)?.parse().ok()
}

/// Runs `skopeo` with `args` (always with `--insecure-policy` and plain-HTTP registries) and
/// panics with its output when it fails.
pub fn skopeo(args: &[&str]) -> String {
    assert!(have_tool("skopeo"), "skopeo is not installed");
    let out = Command::new("skopeo")
        .arg("--insecure-policy")
        .args(args)
        .output()
        .expect("run skopeo");
    assert!(
        out.status.success(),
        "skopeo {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
