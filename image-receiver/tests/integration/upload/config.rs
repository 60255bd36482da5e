//! Bad configuration: one line per bad variable naming it and its value, exit status 2, and
//! nothing bound or written.

use std::process::Command;

use crate::support::BIN;

fn run(env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(BIN)
        .arg("serve")
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("run runr-image-upload");
    (
        out.status.code().expect("an exit code, not a signal"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn missing_variables_exit_2_naming_each() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().display().to_string();
    let (code, stderr) = run(&[("RUNR_UPLOAD_DIR", &dir)]);
    assert_eq!(code, 2, "{stderr}");
    for name in [
        "RUNR_UPLOAD_SIZE",
        "RUNR_UPLOAD_SHA256",
        "RUNR_UPLOAD_TARGET",
    ] {
        let lines: Vec<_> = stderr.lines().filter(|l| l.contains(name)).collect();
        assert_eq!(lines.len(), 1, "one line for {name}: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "nothing written"
    );
}

/// The lines as a person reads them: each message that holds `=` or `"` is quoted.
fn plain(stderr: &str) -> String {
    let lines: Vec<String> = stderr.lines().map(runr_testkit::logfmt::plain).collect();
    lines.join("\n")
}

#[test]
fn bad_values_exit_2_naming_variable_and_value() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().display().to_string();
    let (code, stderr) = run(&[
        ("RUNR_UPLOAD_DIR", &dir),
        ("RUNR_UPLOAD_SIZE", "12x"),
        ("RUNR_UPLOAD_SHA256", "0123"),
        ("RUNR_UPLOAD_TARGET", "app:latest"),
        ("RUNR_UPLOAD_COMPRESS", "brotli"),
        ("PORT", "99999"),
    ]);
    assert_eq!(code, 2, "{stderr}");
    let stderr = plain(&stderr);
    for needle in [
        "RUNR_UPLOAD_SIZE=\"12x\"",
        "RUNR_UPLOAD_SHA256=\"0123\"",
        "RUNR_UPLOAD_TARGET=\"app:latest\"",
        "RUNR_UPLOAD_COMPRESS=\"brotli\"",
        "PORT=\"99999\"",
    ] {
        assert!(stderr.contains(needle), "{needle} in {stderr}");
    }
    let (code, stderr) = run(&[
        ("RUNR_UPLOAD_DIR", "/nonexistent/work"),
        ("RUNR_UPLOAD_SIZE", "1"),
        (
            "RUNR_UPLOAD_SHA256",
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        ),
        ("RUNR_UPLOAD_TARGET", "127.0.0.1:5000/app:1"),
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        plain(&stderr).contains("RUNR_UPLOAD_DIR=\"/nonexistent/work\""),
        "{stderr}"
    );
}

#[test]
fn bad_usage_exits_2_and_version_0() {
    let out = Command::new(BIN).arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(BIN)
        .args(["fetch", "only-one"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(BIN).arg("version").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("RUNR_UPLOAD_TARGET"), "{text}");
}
