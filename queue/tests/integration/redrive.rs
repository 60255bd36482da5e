//! Dead letters an operator can act on: where they go, how many are kept, the start of the last
//! answer's body, and `runr-queue redrive` moving them back (filtered, counted, atomically per
//! entry, while consumers run, and idempotent after a kill -9 halfway).

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use runr_testkit::redis::{Redis, Reply};
use runr_testkit::{wait_for, Child};

use crate::support::*;

/// `runr-queue redrive <args>` with `vars`: its exit status and what it printed on stdout (its
/// log is on stderr).
fn redrive(vars: &[(String, String)], args: &[&str]) -> (std::process::ExitStatus, String) {
    let out = command(vars).arg("redrive").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, printed(&out.stdout))
}

/// Output lines that are not log lines.
pub fn printed(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .filter(|l| !l.starts_with("[runr-queue] "))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn xlen(redis: &Redis, key: &str) -> i64 {
    redis.conn().cmd_str(&["XLEN", key]).int()
}

#[test]
fn dead_letters_go_where_configured_bounded_with_the_answers_first_kib() {
    let dir = tmp();
    let redis = Redis::start();
    // 1,500 "é" after an "x": the 1 KiB bound falls in the middle of a character.
    let receiver = Receiver::start(
        dir.path(),
        &["--always-fail", "--class", "crash", "--fail-chars", "1500"],
    );
    let parked = "orders-parked";
    let mut c = Consumer::start(
        dir.path(),
        "c1",
        &with(
            base_env(&redis, &receiver.url(), "c1"),
            &[
                ("RUNR_QUEUE_MAX_ATTEMPTS", "1"),
                ("RUNR_QUEUE_CONCURRENCY", "32"),
                ("RUNR_QUEUE_DEAD_LETTER_STREAM", parked),
                ("RUNR_QUEUE_DEAD_LETTER_MAXLEN", "100"),
                ("RUNR_QUEUE_LOG", "info"),
            ],
        ),
    );
    assert!(
        c.log().contains("dead_letters=orders-parked"),
        "{}",
        c.log()
    );
    let mut conn = redis.conn();
    let commands: Vec<Vec<Vec<u8>>> = (0..300)
        .map(|i| {
            ["XADD", STREAM, "*", "n", &i.to_string()]
                .iter()
                .map(|s| s.as_bytes().to_vec())
                .collect()
        })
        .collect();
    conn.pipeline(&commands);
    wait_for("every entry dead-lettered", LONG, || {
        (receiver.phase("end").len() >= 300 && conn.pending(STREAM, GROUP) == 0).then_some(())
    });
    assert_eq!(xlen(&redis, DLQ), 0, "the default name is not used");
    // Approximate trimming: whole nodes of 100 entries go, at least 100 dead letters stay.
    let kept = xlen(&redis, parked);
    assert!((100..300).contains(&kept), "{kept} dead letters kept");
    let dead = conn.xrange(parked);
    let (_, fields) = dead.last().unwrap();
    let find = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(find("runr-error").as_deref(), Some("crash"));
    assert_eq!(find("runr-status").as_deref(), Some("500"));
    // The first KiB of the answer, cut before the character the bound splits: valid UTF-8
    // (the test client's lossy read would show U+FFFD otherwise).
    let body = find("runr-body").unwrap();
    assert_eq!(body, format!("x{}", "é".repeat(511)));
    assert_eq!(body.len(), 1023);
    c.stop_cleanly();
}

#[test]
fn redrive_after_a_fix_while_a_consumer_runs() {
    let dir = tmp();
    let redis = Redis::start();
    let failing = Receiver::start(dir.path(), &["--always-fail", "--class", "crash"]);
    let mut a = Consumer::start(
        dir.path(),
        "a",
        &with(
            base_env(&redis, &failing.url(), "a"),
            &[
                ("RUNR_QUEUE_MAX_ATTEMPTS", "1"),
                ("RUNR_QUEUE_MAX_BODY", "1KiB"),
            ],
        ),
    );
    let mut conn = redis.conn();
    // Ten that the function fails (crash, 500), five too large for this consumer's limit
    // (limit, no answer: status 0).
    let big = "b".repeat(2000);
    let mut originals: BTreeMap<String, String> = BTreeMap::new();
    for i in 0..15 {
        let n = i.to_string();
        let fields: Vec<(&str, &str)> = if i < 10 {
            vec![("n", &n), ("kind", "crash")]
        } else {
            vec![("n", &n), ("kind", "big"), ("blob", &big)]
        };
        conn.xadd(STREAM, &fields);
        originals.insert(n.clone(), expected_body(&fields));
    }
    wait_for("15 dead letters", LONG, || {
        (xlen(&redis, DLQ) == 15 && conn.pending(STREAM, GROUP) == 0).then_some(())
    });
    a.stop_cleanly();

    // The fix is deployed: a consumer with a working function and room for the big ones runs
    // while the dead letters are moved back.
    let fixed = Receiver::start(dir.path(), &[]);
    let mut b = Consumer::start(dir.path(), "b", &base_env(&redis, &fixed.url(), "b"));
    let admin = with(base_env(&redis, "", "x"), &[]);
    let admin: Vec<(String, String)> = admin
        .into_iter()
        .filter(|(k, _)| k != "RUNR_QUEUE_TARGET" && k != "RUNR_QUEUE_CONSUMER")
        .collect();
    for (args, moved) in [
        (&["--only", "crash", "--count", "4"][..], 4),
        (&["--only", "500"], 6),
        (&["--only", "timeout,503"], 0),
        (&["--only", "0"], 5),
        (&[], 0),
    ] {
        let (status, out) = redrive(&admin, args);
        assert!(status.success(), "{args:?}: {status}: {out}");
        assert_eq!(
            out,
            format!("moved {moved} dead letters from orders-dlq to orders\n"),
            "{args:?}"
        );
    }
    assert_eq!(xlen(&redis, DLQ), 0);
    // Delivered as new entries, once each, with their own fields only.
    wait_for("the 15 redriven entries delivered", LONG, || {
        (fixed.succeeded().len() == 15 && conn.pending(STREAM, GROUP) == 0).then_some(())
    });
    fixed.assert_no_problems();
    let mut bodies: BTreeMap<String, String> = BTreeMap::new();
    for r in fixed.phase("start") {
        let data = &r["data"];
        let n = data["n"].as_str().unwrap().to_string();
        let body = serde_json::to_string(data).unwrap();
        assert!(!body.contains("runr-"), "{body}");
        assert!(
            bodies.insert(n, r["id"].to_string()).is_none(),
            "twice: {r}"
        );
    }
    assert_eq!(bodies.len(), 15);
    for r in fixed.phase("start") {
        let n = r["data"]["n"].as_str().unwrap();
        assert_eq!(r["sha256"], sha256(originals[n].as_bytes()), "entry {n}");
    }
    b.stop_cleanly();
}

#[test]
fn redrive_killed_halfway_and_run_again_moves_each_dead_letter_once() {
    let redis = Redis::start();
    let total = 5000;
    let mut conn = redis.conn();
    let commands: Vec<Vec<Vec<u8>>> = (0..total)
        .map(|i| {
            let n = i.to_string();
            [
                "XADD",
                DLQ,
                "*",
                "n",
                &n,
                "runr-status",
                "500",
                "runr-error",
                "crash",
                "runr-attempts",
                "5",
                "runr-failed-at",
                "2026-01-01T00:00:00.000Z",
                "runr-id",
                "1-0",
                "runr-body",
                "boom",
            ]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect()
        })
        .collect();
    conn.pipeline(&commands);
    let admin: Vec<(String, String)> = base_env(&redis, "", "x")
        .into_iter()
        .filter(|(k, _)| k != "RUNR_QUEUE_TARGET" && k != "RUNR_QUEUE_CONSUMER")
        .collect();
    let mut cmd = command(&admin);
    cmd.arg("redrive")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = Child::spawn(&mut cmd).unwrap();
    // Killed as soon as it moved some: no chance to finish a page or say anything.
    let guard = Instant::now() + LONG;
    while xlen(&redis, STREAM) == 0 {
        assert!(Instant::now() < guard, "redrive moved nothing");
        std::thread::sleep(Duration::from_millis(1));
    }
    child.signal(Signal::SIGKILL);
    child.wait_timeout(LONG);
    let (moved, left) = (xlen(&redis, STREAM), xlen(&redis, DLQ));
    eprintln!("killed after {moved} of {total}");
    assert!(
        left > 0,
        "redrive finished before the kill: the test proves nothing"
    );
    // Each dead letter is in one place, never both, never neither.
    assert_eq!(moved + left, total as i64);

    let (status, out) = redrive(&admin, &[]);
    assert!(status.success(), "{status}: {out}");
    assert_eq!(
        out,
        format!("moved {left} dead letters from orders-dlq to orders\n")
    );
    assert_eq!(xlen(&redis, DLQ), 0);
    let entries = conn.xrange(STREAM);
    let mut seen = vec![0u32; total];
    for (_, fields) in &entries {
        assert_eq!(fields.len(), 1, "{fields:?}");
        let n: usize = fields[0].1.parse().unwrap();
        seen[n] += 1;
    }
    assert!(seen.iter().all(|c| *c == 1), "moved twice or lost");
    // Nothing left: running it again moves nothing.
    assert_eq!(
        redrive(&admin, &[]).1,
        "moved 0 dead letters from orders-dlq to orders\n"
    );
    assert!(matches!(conn.cmd_str(&["PING"]), Reply::Simple(_)));
}
