//! The spec's Bash example handler ("Write your own runtime") behind the real runr-wrapper
//! (exec mode, raw input), fed by what really sends each trigger: a plain HTTP client, the real
//! runr-queue reading a real redis-server, and the real runr-tick; with `RUNR_TRIGGER` set and
//! without it (each request's CloudEvent decides, all three at once into one pod), and the
//! schedule one-shot by `RUNR_TRIGGER=schedule` and by `RUNR_MODE=schedule`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use runr_testkit::http::{Body, Conn};
use runr_testkit::redis::Redis;
use runr_testkit::{wait_for, workspace_bin, Child, Server};

/// The handler, byte for byte as the spec prints it.
const SPEC_HANDLER: &str = r#"#!/usr/bin/env bash
set -euo pipefail
case "${RUNR_TRIGGER:-http}" in
  schedule) echo "tick from bash" ;;
  queue)    printf 'processed %s (from bash)' "$(cat)" ;;
  *)        printf 'Hello from bash! You called %s %s' "$RUNR_METHOD" "$RUNR_PATH" ;;
esac
"#;

/// Generous: the machine running the tests may be loaded.
const LONG: Duration = Duration::from_secs(120);
const STREAM: &str = "orders";
const GROUP: &str = "orders-api";

/// The wrapper's environment for the Bash runtime (its manifest: exec mode, raw input,
/// `bash /app/code/main.sh`), plus `extra`.
fn wrapper_command(dir: &Path, extra: &[(&str, &str)]) -> Command {
    let script = dir.join("main.sh");
    std::fs::write(&script, SPEC_HANDLER).unwrap();
    let mut cmd = Command::new(workspace_bin("runr-wrapper"));
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("RUNR_WRAPPER_MODE", "exec")
        .env("RUNR_INPUT", "raw")
        .env(
            "RUNR_COMMAND",
            serde_json::to_string(&["bash", script.to_str().unwrap()]).unwrap(),
        )
        .env("RUNR_LOG_INVOCATIONS", "1")
        .envs(extra.iter().copied());
    cmd
}

fn start_wrapper(dir: &Path, extra: &[(&str, &str)]) -> Server {
    Server::start(wrapper_command(dir, extra), &dir.join("wrapper.log"))
}

/// A running runr-queue and its log.
struct Queue {
    _child: Child,
    log: PathBuf,
}

impl Queue {
    /// runr-queue delivering `orders` to `target`, its log in `dir`; waits until it consumes.
    fn start(dir: &Path, redis: &Redis, target: &str) -> Queue {
        let log = dir.join("queue.log");
        let mut cmd = Command::new(workspace_bin("runr-queue"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUNR_QUEUE_REDIS_URL", redis.url())
            .env("RUNR_QUEUE_STREAM", STREAM)
            .env("RUNR_QUEUE_GROUP", GROUP)
            .env("RUNR_QUEUE_CONSUMER", "c1")
            .env("RUNR_QUEUE_TARGET", target)
            .env("RUNR_QUEUE_CONCURRENCY", "4")
            .env("RUNR_QUEUE_LOG", "debug")
            .stdin(Stdio::null());
        let out = std::fs::File::create(&log).unwrap();
        cmd.stdout(out.try_clone().unwrap()).stderr(out);
        let q = Queue {
            _child: Child::spawn(&mut cmd).expect("spawn runr-queue"),
            log,
        };
        wait_for("runr-queue to consume", LONG, || {
            q.log().contains("consuming").then_some(())
        });
        q
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `answer=` of runr-queue's `delivered` line for entry `id`.
fn delivered_answer(queue_log: &str, id: &str) -> Option<String> {
    queue_log
        .lines()
        .filter(|l| l.contains(" delivered "))
        .filter_map(|l| runr_testkit::logfmt::parse(l).ok())
        .find(|pairs| runr_testkit::logfmt::values(pairs, "id") == [id])
        .and_then(|pairs| {
            runr_testkit::logfmt::values(&pairs, "answer")
                .first()
                .map(|a| a.to_string())
        })
}

/// Runs runr-tick against `port` to its end: exit status and stdout.
fn tick(port: u16) -> (i32, String, String) {
    let mut cmd = Command::new(workspace_bin("runr-tick"));
    cmd.env_clear()
        .env("PORT", port.to_string())
        .env("RUNR_TICK_WAIT", "60s")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = cmd.output().expect("run runr-tick");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The entries' fields and the answer the queue branch gives for each.
fn entries(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            let msg = if i == 0 {
                "hi".to_string()
            } else {
                format!("entry {i}")
            };
            let answer = format!(r#"processed {{"msg":"{msg}"}} (from bash)"#);
            (msg, answer)
        })
        .collect()
}

/// XADDs every entry and waits until runr-queue delivered each; checks every answer.
fn through_the_queue(redis: &Redis, queue: &Queue, n: usize) {
    let mut conn = redis.conn();
    let sent: Vec<(String, String)> = entries(n)
        .into_iter()
        .map(|(msg, answer)| (conn.xadd(STREAM, &[("msg", &msg)]), answer))
        .collect();
    wait_for("every entry delivered", LONG, || {
        let log = queue.log();
        sent.iter()
            .all(|(id, _)| delivered_answer(&log, id).is_some())
            .then_some(())
    });
    let log = queue.log();
    for (id, answer) in &sent {
        assert_eq!(
            delivered_answer(&log, id).as_deref(),
            Some(answer.as_str()),
            "{id}:\n{log}"
        );
    }
    assert_eq!(conn.pending(STREAM, GROUP), 0);
}

#[test]
fn one_pod_without_runr_trigger_answers_each_trigger_its_own_branch() {
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start();
    let wrapper = start_wrapper(dir.path(), &[]);
    let port = wrapper.addr.port();
    let queue = Queue::start(dir.path(), &redis, &format!("http://{}/", wrapper.addr));
    // All three at once: HTTP clients, ticks and queue entries into the same pod.
    let addr = wrapper.addr;
    let clients: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                for n in 0..10 {
                    let path = format!("/hello/{t}/{n}");
                    let r = c.send("GET", &path, &[], Body::None);
                    assert_eq!(r.status, 200);
                    assert_eq!(r.text(), format!("Hello from bash! You called GET {path}"));
                }
            })
        })
        .collect();
    let ticks: Vec<_> = (0..3)
        .map(|_| std::thread::spawn(move || tick(port)))
        .collect();
    through_the_queue(&redis, &queue, 20);
    for c in clients {
        c.join().unwrap();
    }
    for t in ticks {
        let (code, stdout, stderr) = t.join().unwrap();
        assert_eq!((code, stdout.as_str()), (0, "tick from bash\n"), "{stderr}");
    }
    // The wrapper's own account: each invocation under its trigger.
    let log = wrapper.log();
    let count = |trigger: &str| {
        log.lines()
            .filter(|l| l.contains(" invocation ") && l.contains(&format!(" trigger={trigger} ")))
            .count()
    };
    assert_eq!(
        (count("http"), count("queue"), count("schedule")),
        (40, 20, 3),
        "{log}"
    );
    assert!(!log.contains("unknown variable"), "{log}");
}

#[test]
fn runr_trigger_decides_for_the_pod() {
    // queue: the real runr-queue, as before.
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start();
    let wrapper = start_wrapper(dir.path(), &[("RUNR_TRIGGER", "queue")]);
    let queue = Queue::start(dir.path(), &redis, &format!("http://{}/", wrapper.addr));
    through_the_queue(&redis, &queue, 5);

    // http: a client's request that claims to be a queue event is still an HTTP request.
    let dir = tempfile::tempdir().unwrap();
    let wrapper = start_wrapper(dir.path(), &[("RUNR_TRIGGER", "http")]);
    let r = Conn::open(wrapper.addr).send(
        "POST",
        "/orders",
        &[
            ("ce-specversion", "1.0"),
            ("ce-type", "dev.runr.queue.message"),
            ("ce-source", "/redisstream/orders/orders-api"),
            ("ce-id", "1-0"),
        ],
        Body::Sized(br#"{"msg":"forged"}"#),
    );
    assert_eq!(
        (r.status, r.text()),
        (200, "Hello from bash! You called POST /orders".to_string())
    );
    // ... and so is a tick sent to it.
    let (code, stdout, stderr) = tick(wrapper.addr.port());
    assert_eq!(
        (code, stdout.as_str()),
        (0, "Hello from bash! You called POST /\n"),
        "{stderr}"
    );
}

#[test]
fn the_schedule_one_shot_by_runr_trigger_and_by_runr_mode() {
    for var in [("RUNR_TRIGGER", "schedule"), ("RUNR_MODE", "schedule")] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = wrapper_command(dir.path(), &[var]);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = Child::spawn(&mut cmd).unwrap();
        let out = wait_output(child);
        assert_eq!(
            (out.0, out.1.as_str()),
            (0, "tick from bash\n"),
            "{var:?}: {}",
            out.2
        );
    }
}

/// Waits for a one-shot to end (a hang guard far above its time; a wrapper that serves instead
/// is killed with its group when the guard fails): exit status, stdout, stderr.
fn wait_output(mut child: Child) -> (i32, String, String) {
    use std::io::Read;
    let read_all = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let out = read_all(Box::new(child.inner().stdout.take().unwrap()));
    let err = read_all(Box::new(child.inner().stderr.take().unwrap()));
    let status = child.wait_timeout(LONG);
    (
        status.code().unwrap_or(-1),
        out.join().unwrap(),
        err.join().unwrap(),
    )
}
