//! What the tests share: the real binary, the CloudEvents receiver, a run and its output.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use runr_testkit::Child;

pub const TICK: &str = env!("CARGO_BIN_EXE_runr-tick");

pub fn receiver_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ce_receiver.py")
}

/// Starts the CloudEvents receiver on `port` (0: any) answering `status`; returns it and its port.
pub fn start_receiver(port: u16, status: u16) -> (Child, u16) {
    let mut child = Child::spawn(
        Command::new("python3")
            .arg(receiver_script())
            .arg(port.to_string())
            .arg(status.to_string())
            .stdout(Stdio::piped()),
    )
    .expect("start python3 receiver");
    let mut line = String::new();
    BufReader::new(child.inner().stdout.as_mut().unwrap())
        .read_line(&mut line)
        .expect("read receiver port");
    let port = line
        .trim()
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("receiver said {line:?}"))
        .parse()
        .unwrap();
    (child, port)
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Starts `runr-tick` with exactly `env` (plus PATH) and waits for it.
pub fn spawn_tick(env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(TICK);
    cmd.env_clear()
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Child::spawn(&mut cmd).expect("spawn runr-tick")
}

pub fn finish(mut child: Child) -> Run {
    let status = child.wait_timeout(Duration::from_secs(30));
    let mut stdout = String::new();
    let mut stderr = String::new();
    child
        .inner()
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .inner()
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    Run {
        code: status.code().expect("exited by a signal"),
        stdout,
        stderr,
    }
}

pub fn run_tick(env: &[(&str, String)]) -> Run {
    finish(spawn_tick(env))
}
