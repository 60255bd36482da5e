//! Starting a server binary under test: `PORT=0`, its stderr (and stdout) in a log file the
//! test can read, and the bound port read back from its `listening` line, so no test races
//! another process for a free port.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{wait_for, Child};

/// How long a server gets to print its `listening` line (a loaded CI machine is slow).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running server process whose output goes to a log file.
pub struct Server {
    /// The process (killed with its group on drop).
    pub child: Child,
    /// `127.0.0.1:<the port it bound>`.
    pub addr: SocketAddr,
    log: PathBuf,
}

impl Server {
    /// Spawns `cmd` with `PORT=0` (unless the caller set `PORT`), stdout and stderr appended to
    /// `log`, and waits for its `listening` line. Panics with the log when the process exits
    /// first or prints nothing in time.
    pub fn start(mut cmd: Command, log: &Path) -> Server {
        let port_set = cmd.get_envs().any(|(k, v)| k == "PORT" && v.is_some());
        if !port_set {
            cmd.env("PORT", "0");
        }
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        let skip = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0) as usize;
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let program = cmd.get_program().to_string_lossy().into_owned();
        let mut child = Child::spawn(&mut cmd).unwrap_or_else(|e| panic!("spawn {program}: {e}"));
        let addr = wait_listening(&mut child, log, skip, &program);
        Server {
            child,
            addr,
            log: log.to_path_buf(),
        }
    }

    /// Everything the server wrote so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Waits until the log contains `needle`.
    pub fn wait_log(&self, needle: &str) {
        wait_for(&format!("{needle:?} in the log"), START_TIMEOUT, || {
            self.log().contains(needle).then_some(())
        });
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }
}

/// Waits for the first `listening` line written after byte `skip` of `log` and returns the
/// loopback address of the port it names.
fn wait_listening(child: &mut Child, log: &Path, skip: usize, program: &str) -> SocketAddr {
    wait_for(&format!("{program} to listen"), START_TIMEOUT, || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let fresh = text.get(skip..).unwrap_or("");
        if let Some(port) = fresh.lines().find_map(listening_port) {
            return Some(SocketAddr::from(([127, 0, 0, 1], port)));
        }
        if let Ok(Some(status)) = child.inner().try_wait() {
            panic!("{program} exited with {status} before listening:\n{fresh}");
        }
        None
    })
}

/// The port of a `listening addr=<host>:<port>` log line (any prefix, level or field order),
/// or of a JSON log line with `"msg":"listening"` and `"addr":"<host>:<port>"`.
pub fn listening_port(line: &str) -> Option<u16> {
    if !line.contains("listening") {
        return None;
    }
    let addr = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix("addr="))
        .or_else(|| {
            let rest = line.split_once("\"addr\":\"")?.1;
            rest.split_once('"').map(|(addr, _)| addr)
        })?;
    addr.trim_matches('"').rsplit_once(':')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_from_listening_lines() {
        assert_eq!(
            listening_port("[runr-wrapper] listening addr=0.0.0.0:41234 mode=exec"),
            Some(41234)
        );
        assert_eq!(
            listening_port(
                "[runr-image-upload] 2026-12-01T07:00:00.000Z INFO listening dir=/w addr=[::]:8080"
            ),
            Some(8080)
        );
        assert_eq!(
            listening_port(
                r#"{"time":"2026-12-01T07:00:00.000Z","level":"info","msg":"listening","addr":"0.0.0.0:41234"}"#
            ),
            Some(41234)
        );
        assert_eq!(listening_port("[x] stopped addr=0.0.0.0:1"), None);
        assert_eq!(listening_port("[x] listening"), None);
    }

    #[test]
    fn a_server_is_found_on_the_port_it_bound() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        // A shell "server" that only prints the line: enough to test the reading side.
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo \"[t] listening addr=0.0.0.0:$((PORT + 4242))\"; sleep 30",
        ]);
        let s = Server::start(cmd, &log);
        assert_eq!(s.addr.port(), 4242);
    }

    #[test]
    #[should_panic(expected = "exited with")]
    fn a_server_that_exits_first_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo bad config; exit 2"]);
        Server::start(cmd, &log);
    }
}
