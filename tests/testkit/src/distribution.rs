//! One `docker-registry` process (Debian's CNCF distribution 2.8) with a configuration the caller
//! extends (proxy, auth, TLS), its storage and log in a temporary directory: the launcher
//! behind [`crate::TokenRegistry`] and [`crate::TlsRegistry`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{free_port, have_tool, http_get_status, wait_for, Child};

/// How long a registry gets to answer after it was spawned (a loaded CI machine is slow).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// New ports tried when the first free port was taken before the registry bound it.
const PORT_ATTEMPTS: usize = 5;
/// How often a registry whose port is its own for good tries it again while another socket
/// holds it, [`PORT_WAIT`] apart (10 s in all).
const PORT_WAITS: usize = 100;
const PORT_WAIT: Duration = Duration::from_millis(100);
/// What Go's HTTPS server answers a plain-HTTP request with: proof it is up and serving TLS.
const PLAIN_TO_TLS: u16 = 400;

pub(crate) struct Distribution {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    /// YAML appended to the base configuration (top-level sections: `proxy:`, `auth:`, …).
    extra: String,
    /// `http.tls` certificate and key, when it serves HTTPS.
    tls: Option<(PathBuf, PathBuf)>,
    /// `log.level`.
    log_level: &'static str,
    /// The port is the registry's for good: it answered there once (clients know it), or
    /// the caller chose it.
    port_fixed: bool,
}

impl Distribution {
    /// A stopped registry with its own directory and a free port.
    pub(crate) fn new(prefix: &str) -> Distribution {
        assert!(
            have_tool("docker-registry"),
            "docker-registry is not installed (apt-get install docker-registry; .ci/run does this)"
        );
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("tempdir");
        Distribution {
            dir,
            port: free_port(),
            child: None,
            extra: String::new(),
            tls: None,
            log_level: "info",
            port_fixed: false,
        }
    }

    /// Serves on `port`, the caller's choice, instead of a free one.
    pub(crate) fn on_port(&mut self, port: u16) {
        self.port = port;
        self.port_fixed = true;
    }

    /// Logs at `level` (`info` by default; `warn` keeps a busy registry's log short).
    pub(crate) fn log_level(&mut self, level: &'static str) {
        self.log_level = level;
    }

    /// Its directory (configuration, storage, log), for files its configuration names.
    pub(crate) fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Sets what the next start appends to the configuration and whether it serves HTTPS.
    pub(crate) fn configure(&mut self, extra: String, tls: Option<(PathBuf, PathBuf)>) {
        self.extra = extra;
        self.tls = tls;
    }

    /// First start: like [`Distribution::restart`], but when another process took a free port
    /// in the meantime it tries a new one.
    pub(crate) fn start(&mut self) {
        if self.port_fixed {
            return self.restart();
        }
        for attempt in 1..=PORT_ATTEMPTS {
            match self.spawn_and_wait() {
                Ok(()) => {
                    self.port_fixed = true;
                    return;
                }
                Err(log) if log.contains("address already in use") && attempt < PORT_ATTEMPTS => {
                    self.port = free_port();
                }
                Err(log) => panic!("docker-registry did not start:\n{log}"),
            }
        }
    }

    /// Starts again on the same port and storage (after [`Distribution::stop`]). While another
    /// socket holds the port (a client's ephemeral port can take it while the registry is
    /// down), it tries again until the port is let go.
    pub(crate) fn restart(&mut self) {
        for attempt in 1..=PORT_WAITS {
            match self.spawn_and_wait() {
                Ok(()) => {
                    self.port_fixed = true;
                    return;
                }
                Err(log) if log.contains("address already in use") && attempt < PORT_WAITS => {
                    std::thread::sleep(PORT_WAIT);
                }
                Err(log) => panic!("docker-registry did not start again:\n{log}"),
            }
        }
    }

    /// SIGKILL to its process group; storage stays.
    pub(crate) fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub(crate) fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    fn config(&self) -> String {
        let tls = match &self.tls {
            Some((cert, key)) => format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            ),
            None => String::new(),
        };
        format!(
            "version: 0.1\nlog:\n  level: {}\n  accesslog:\n    disabled: true\nstorage:\n  \
             filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  \
             maintenance:\n    uploadpurging:\n      enabled: false\nhttp:\n  addr: {}\n{tls}{}",
            self.log_level,
            self.storage().display(),
            self.addr(),
            self.extra
        )
    }

    /// Spawns the registry and waits until it answers; `Err(log)` when it exited first.
    fn spawn_and_wait(&mut self) -> Result<(), String> {
        self.stop();
        let config = self.dir.path().join("config.yml");
        std::fs::write(&config, self.config()).expect("write registry config");
        let log_path = self.dir.path().join("registry.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        let child = Child::spawn(
            Command::new("docker-registry")
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("clone log"))
                .stderr(log),
        )
        .expect("spawn docker-registry");
        self.child = Some(child);
        let addr = self.addr();
        let tls = self.tls.is_some();
        let mut exited = None;
        wait_for(
            &format!("docker-registry to answer on {addr}"),
            START_TIMEOUT,
            || {
                if let Some(c) = self.child.as_mut() {
                    if let Ok(Some(status)) = c.inner().try_wait() {
                        exited = Some(status);
                        return Some(());
                    }
                }
                let status = http_get_status(addr, "/v2/")?;
                let up = if tls {
                    status == PLAIN_TO_TLS
                } else {
                    status == 200 || status == 401
                };
                up.then_some(())
            },
        );
        match exited {
            Some(status) => {
                self.child = None;
                Err(format!("exited with {status}: {}", self.log()))
            }
            None => Ok(()),
        }
    }
}

impl Drop for Distribution {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another process took the free port before the registry bound it: the first start
    /// moves to a new port instead of failing.
    #[test]
    fn a_taken_port_is_replaced_on_the_first_start() {
        let mut dist = Distribution::new("runr-dist-test-");
        let taken = std::net::TcpListener::bind(dist.addr()).expect("bind the chosen port");
        dist.start();
        assert_ne!(dist.addr(), taken.local_addr().unwrap());
        assert_eq!(http_get_status(dist.addr(), "/v2/"), Some(200));
        // A restart keeps the port it ended up with.
        let port = dist.addr();
        dist.stop();
        dist.restart();
        assert_eq!(dist.addr(), port);
        assert_eq!(http_get_status(dist.addr(), "/v2/"), Some(200));
    }
}
