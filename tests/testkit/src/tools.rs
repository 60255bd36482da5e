//! Running the real command-line clients the harness proves its fixtures with (skopeo, curl)
//! and keeping what they print, failures included: a test of a broken certificate needs the
//! tool's own error text.

use std::process::{Command, ExitStatus};

use crate::have_tool;

/// What a tool printed and how it ended.
#[derive(Debug, Clone)]
pub struct ToolOutput {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl ToolOutput {
    /// True when it exited 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The last non-empty line of stderr: where skopeo and curl put their error.
    pub fn last_error_line(&self) -> &str {
        self.stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
    }
}

fn run(program: &str, args: &[&str]) -> ToolOutput {
    assert!(have_tool(program), "{program} is not installed");
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    ToolOutput {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `skopeo --insecure-policy --command-timeout 120s <args>`, whatever its outcome.
pub fn skopeo_output(args: &[&str]) -> ToolOutput {
    let mut all = vec!["--insecure-policy", "--command-timeout", "120s"];
    all.extend_from_slice(args);
    run("skopeo", &all)
}

/// `curl -sS --max-time 60 <args>`, whatever its outcome.
pub fn curl_output(args: &[&str]) -> ToolOutput {
    let mut all = vec!["-sS", "--max-time", "60"];
    all.extend_from_slice(args);
    run("curl", &all)
}
