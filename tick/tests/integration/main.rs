//! `runr-tick` end to end: the real binary against a real CloudEvents consumer (python3 with the
//! `cloudevents` SDK from PyPI), a server that answers an error, a late server and no server.

mod support;

use std::net::SocketAddr;
use std::process::Command;

use runr_testkit::free_port;
use runr_testkit::http::Body;

use support::*;

#[test]
fn tick_is_a_conforming_cloudevent() {
    let (_rx, port) = start_receiver(0, 200);
    let run = run_tick(&[("PORT", port.to_string())]);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    let seen: serde_json::Value = serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("stdout {:?}: {e}", run.stdout));
    assert_eq!(seen["type"], "dev.runr.schedule.tick", "{seen}");
    assert_eq!(seen["source"], "/runr/schedule");
    assert_eq!(seen["specversion"], "1.0");
    assert_eq!(seen["data"], serde_json::json!({"trigger": "schedule"}));
    assert_eq!(seen["path"], "/");
    assert_eq!(seen["id"].as_str().unwrap().len(), 36);

    // Two ticks never share an id.
    let again = run_tick(&[("PORT", port.to_string())]);
    let again: serde_json::Value = serde_json::from_str(again.stdout.trim()).unwrap();
    assert_ne!(again["id"], seen["id"]);
}

#[test]
fn receiver_rejects_a_non_conforming_event() {
    // The consumer is only a witness if it can say no: a structured-mode-less POST without
    // ce-specversion must be refused.
    let (_rx, port) = start_receiver(0, 200);
    let body = r#"{"trigger":"schedule"}"#;
    let answer = runr_testkit::http::request(
        SocketAddr::from(([127, 0, 0, 1], port)),
        "POST",
        "/",
        &[
            ("ce-type", "dev.runr.schedule.tick"),
            ("ce-source", "/runr/schedule"),
            ("ce-id", "1"),
            ("Content-Type", "application/json"),
            ("Connection", "close"),
        ],
        Body::Sized(body.as_bytes()),
    );
    assert_eq!(answer.status, 400, "{}", answer.text());
}

#[test]
fn tick_url_with_path_is_used() {
    let (_rx, port) = start_receiver(0, 202);
    let run = run_tick(&[
        ("PORT", "1".to_string()),
        ("RUNR_TICK_URL", format!("http://localhost:{port}/cron?x=1")),
    ]);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    let seen: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(seen["path"], "/cron?x=1");
}

#[test]
fn error_status_prints_body_and_exits_1() {
    let (_rx, port) = start_receiver(0, 500);
    let run = run_tick(&[("PORT", port.to_string())]);
    assert_eq!(run.code, 1, "stderr: {}", run.stderr);
    assert!(
        run.stdout.contains("dev.runr.schedule.tick"),
        "{}",
        run.stdout
    );
    assert!(run.stderr.contains("status=500"), "{}", run.stderr);
}

#[test]
fn waits_for_a_late_server() {
    let port = free_port();
    let tick = spawn_tick(&[("PORT", port.to_string())]);
    // The tick is already retrying while python starts up (about 100 ms).
    let (_rx, _) = start_receiver(port, 200);
    let run = finish(tick);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    assert!(
        run.stdout.contains("\"trigger\": \"schedule\""),
        "{}",
        run.stdout
    );
}

#[test]
fn nobody_listening_exits_1_with_a_line() {
    let port = free_port();
    let run = run_tick(&[
        ("PORT", port.to_string()),
        ("RUNR_TICK_WAIT", "300ms".to_string()),
    ]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.is_empty());
    let line = run.stderr.trim();
    assert!(line.starts_with("[runr-tick] ERROR"), "{line}");
    assert!(
        line.contains(&format!("nothing listens on http://127.0.0.1:{port}/")),
        "{line}"
    );
}

#[test]
fn bad_configuration_exits_2_naming_each_variable() {
    let run = run_tick(&[
        ("PORT", "eighty".to_string()),
        ("RUNR_TICK_WAIT", "1 day".to_string()),
    ]);
    assert_eq!(run.code, 2);
    // Read as a person does: the message is quoted (it holds `=` and `"`).
    let lines: Vec<String> = run
        .stderr
        .lines()
        .map(runr_testkit::logfmt::plain)
        .collect();
    assert_eq!(lines.len(), 2, "{}", run.stderr);
    assert!(lines[0].contains("PORT=\"eighty\""), "{}", lines[0]);
    assert!(
        lines[1].contains("RUNR_TICK_WAIT=\"1 day\""),
        "{}",
        lines[1]
    );
}

#[test]
fn a_url_with_credentials_is_refused_naming_the_variable_not_the_password() {
    // The tick speaks plain HTTP: a user name and password would go out in the clear.
    let run = run_tick(&[(
        "RUNR_TICK_URL",
        "http://user:s3cr3t@localhost:9/".to_string(),
    )]);
    assert_eq!(run.code, 2);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    assert!(lines[0].contains("RUNR_TICK_URL"), "{}", lines[0]);
    // The refused URL is named without its credentials.
    assert!(!lines[0].contains("s3cr3t"), "{}", lines[0]);
    assert!(lines[0].contains("http://***@localhost:9/"), "{}", lines[0]);
    assert!(
        lines[0].contains("credentials in the URL are not supported"),
        "{}",
        lines[0]
    );
}

#[test]
fn version_prints_the_crate_version() {
    let out = Command::new(TICK).arg("version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("runr-tick {}", env!("CARGO_PKG_VERSION"))
    );
}
