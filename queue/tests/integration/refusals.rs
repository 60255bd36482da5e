//! Redis refusing a command for good (NOPERM from an ACL, WRONGPASS, NOAUTH) on any command the
//! consumer sends ends it with exit 1 and a line naming the command and the key; the entries it
//! held stay pending, and its password shows in no line, whatever characters it holds.

use runr_testkit::logfmt;
use runr_testkit::redis::{Conn, Redis, Reply};

use crate::support::*;

/// A password with every character that ends a URL's parts early, a percent sign, a blank and
/// a non-ASCII letter.
const PASSWORD: &str = "p@ss/w#rd?:100%é x";
const USER: &str = "queue-app";

/// `PASSWORD` as a URL's userinfo must write it.
fn encoded(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn url_for(redis: &Redis, user: &str, password: &str) -> String {
    format!(
        "redis://{}:{}@{}",
        encoded(user),
        encoded(password),
        redis.addr()
    )
}

fn ok(reply: Reply) {
    assert_eq!(reply, Reply::Simple("OK".into()));
}

/// `ACL SETUSER queue-app on >PASSWORD <rules…>`.
fn acl_user(conn: &mut Conn, rules: &[&str]) {
    let pass = format!(">{PASSWORD}");
    let mut args = vec!["ACL", "SETUSER", USER, "reset", "on", pass.as_str()];
    args.extend_from_slice(rules);
    ok(conn.cmd_str(&args));
}

/// An entry pending on `consumer` (read, not acknowledged), in a group created at 0.
fn pending_on(conn: &mut Conn, consumer: &str) -> String {
    create_group_with(conn);
    let id = conn.xadd(STREAM, &[("k", "v")]);
    let read = conn.cmd_str(&[
        "XREADGROUP",
        "GROUP",
        GROUP,
        consumer,
        "STREAMS",
        STREAM,
        ">",
    ]);
    assert_eq!(read.items().len(), 1, "{read:?}");
    id
}

fn create_group_with(conn: &mut Conn) {
    ok(conn.cmd_str(&["XGROUP", "CREATE", STREAM, GROUP, "0", "MKSTREAM"]));
}

/// What the consumer prints when Redis refuses it: exit 1, one error line naming `command`
/// and `key` with Redis's `code`, and the password nowhere.
fn assert_refused(c: &mut Consumer, command: &str, key: &str, code: &str) {
    let status = c.child.wait_timeout(LONG);
    let log = c.log();
    assert_eq!(status.code(), Some(1), "{log}");
    let lines = c.lines_with("redis refused a command");
    assert_eq!(lines.len(), 1, "{log}");
    let line = &lines[0];
    let pairs = logfmt::parse(line).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(logfmt::values(&pairs, "command"), [command], "{line}");
    assert_eq!(logfmt::values(&pairs, "key"), [key], "{line}");
    let error = logfmt::values(&pairs, "error");
    assert!(
        error.len() == 1 && error[0].starts_with(code),
        "{code} not the error of: {line}"
    );
    assert!(log.contains("ERROR exiting"), "{log}");
    for secret in [PASSWORD, &encoded(PASSWORD), "w#rd", "p@ss", "100%"] {
        assert!(!log.contains(secret), "{secret:?} printed:\n{log}");
        assert!(
            !log.lines().any(|l| logfmt::plain(l).contains(secret)),
            "{secret:?} printed (quoted):\n{log}"
        );
    }
}

/// The consumer as `USER` with the ACL `rules`, against a receiver answering `args`.
fn as_user(
    redis: &Redis,
    rules: &[&str],
    receiver_args: &[&str],
    extra: &[(&str, &str)],
) -> (tempfile::TempDir, Receiver, Consumer) {
    let dir = tmp();
    acl_user(&mut redis.conn(), rules);
    let receiver = Receiver::start(dir.path(), receiver_args);
    let env = with(
        base_env(redis, &receiver.url(), "c1"),
        &[
            &[(
                "RUNR_QUEUE_REDIS_URL",
                url_for(redis, USER, PASSWORD).as_str(),
            )][..],
            extra,
        ]
        .concat(),
    );
    let c = Consumer::spawn(dir.path(), "c1", &env);
    (dir, receiver, c)
}

#[test]
fn no_right_on_the_dead_letter_stream_stops_it_with_the_entry_pending() {
    let redis = Redis::start();
    let mut admin = redis.conn();
    // Every right on the stream, none on orders-dlq.
    create_group_with(&mut admin);
    let (_dir, receiver, mut c) = as_user(
        &redis,
        &["~orders", "+@all"],
        &["--always-fail"],
        &[("RUNR_QUEUE_MAX_ATTEMPTS", "1")],
    );
    let id = admin.xadd(STREAM, &[("k", "v")]);
    assert_refused(&mut c, "XADD", DLQ, "NOPERM");
    assert_eq!(receiver.phase("start").len(), 1);
    // Neither moved nor acknowledged: still pending on c1, for a consumer that may write it.
    let pending = admin.pending_entries(STREAM, GROUP);
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(
        (pending[0].0.as_str(), pending[0].1.as_str()),
        (id.as_str(), "c1")
    );
    assert_eq!(admin.cmd_str(&["EXISTS", DLQ]).int(), 0);
    assert!(c.log().contains("left_pending=1"), "{}", c.log());
}

#[test]
fn every_command_refused_is_named_with_its_key() {
    // (case, ACL rules, receiver arguments, variables, the command refused, setup: the entry
    // left pending, if any)
    type Setup = fn(&mut Conn) -> Option<String>;
    type Case<'a> = (
        &'a str,
        &'a [&'a str],
        &'a [&'a str],
        &'a [(&'a str, &'a str)],
        &'a str,
        Setup,
    );
    let cases: [Case; 6] = [
        (
            "group",
            &["~orders*", "+@all", "-xgroup"],
            &[],
            &[],
            "XGROUP CREATE",
            |_| None,
        ),
        (
            "read",
            &["~orders*", "+@all", "-xreadgroup"],
            &[],
            &[],
            "XREADGROUP",
            |c| {
                create_group_with(c);
                None
            },
        ),
        (
            "ack",
            &["~orders*", "+@all", "-xack"],
            &[],
            &[],
            "XACK",
            |c| {
                create_group_with(c);
                Some(c.xadd(STREAM, &[("k", "v")]))
            },
        ),
        (
            "retry count",
            &["~orders*", "+@all", "-xclaim"],
            &["--fail-until", "2"],
            &[("RUNR_QUEUE_BACKOFF", "10ms")],
            "XCLAIM",
            |c| {
                create_group_with(c);
                Some(c.xadd(STREAM, &[("k", "v")]))
            },
        ),
        (
            "claim",
            &["~orders*", "+@all", "-xautoclaim"],
            &[],
            &[("RUNR_QUEUE_CLAIM_IDLE", "100ms")],
            "XAUTOCLAIM",
            |c| Some(pending_on(c, "gone")),
        ),
        // Its own pending entry at start: the delivery count is read next.
        (
            "pending counts",
            &["~orders*", "+@all", "-xpending"],
            &[],
            &[],
            "XPENDING",
            |c| Some(pending_on(c, "c1")),
        ),
    ];
    for (what, rules, receiver_args, extra, command, setup) in cases {
        eprintln!("case: {what}");
        let redis = Redis::start();
        let mut admin = redis.conn();
        // Before the consumer starts: it would create the group itself otherwise.
        let held = setup(&mut admin);
        let (_dir, _receiver, mut c) = as_user(&redis, rules, receiver_args, extra);
        assert_refused(&mut c, command, STREAM, "NOPERM");
        if let Some(id) = held {
            // Left as it was: pending, nothing acknowledged or moved.
            let pending = admin.pending_entries(STREAM, GROUP);
            assert_eq!(pending.len(), 1, "{what}: {pending:?}");
            assert_eq!(pending[0].0, id, "{what}");
        }
        assert_eq!(admin.cmd_str(&["EXISTS", DLQ]).int(), 0, "{what}");
    }
}

#[test]
fn a_wrong_password_or_none_at_all_stops_it_at_once() {
    let redis = Redis::start();
    let mut admin = redis.conn();
    acl_user(&mut admin, &["~*", "+@all"]);
    let dir = tmp();
    // WRONGPASS: the password of the URL is not the user's (and is not printed either).
    let env = with(
        base_env(&redis, "http://127.0.0.1:9/", "c1"),
        &[(
            "RUNR_QUEUE_REDIS_URL",
            &url_for(&redis, USER, &format!("{PASSWORD}-wrong")),
        )],
    );
    let mut c = Consumer::spawn(dir.path(), "wrongpass", &env);
    assert_refused(&mut c, "AUTH", "", "WRONGPASS");

    // NOAUTH: Redis wants a password and the URL has none.
    ok(admin.cmd_str(&["AUTH", USER, PASSWORD]));
    ok(admin.cmd_str(&["ACL", "SETUSER", "default", "off"]));
    let mut c = Consumer::spawn(
        dir.path(),
        "noauth",
        &base_env(&redis, "http://127.0.0.1:9/", "c1"),
    );
    assert_refused(&mut c, "XGROUP CREATE", STREAM, "NOAUTH");
}
