//! Request headers in exec mode, where they become environment variables: what the kernel
//! cannot pass is refused with 431 before anything is spawned (one variable longer than
//! execve takes, or all of them together more than the stack limit allows), and header names
//! that map to the same variable are joined, never overwritten.

use std::process::Command;

use crate::support::{bin, env, fixtures, RespExt, Wrapper};

/// `RUNR_HEADER_X_BIG=`.
const VAR_PREFIX: usize = "RUNR_HEADER_X_BIG=".len();
/// Longest environment string execve takes, NUL included (32 pages of 4 KiB).
const MAX_ARG_STRLEN: usize = 32 * 4096;

/// A handler that answers the length of `RUNR_HEADER_X_BIG` and how many `RUNR_HEADER_X_*`
/// variables it got.
fn length_handler() -> Vec<(String, String)> {
    env(
        "exec",
        &[
            "sh",
            "-c",
            r#"printf '%s %s' "${#RUNR_HEADER_X_BIG}" "$(env | grep -c '^RUNR_HEADER_X_')""#,
        ],
    )
}

fn is_431(r: &runr_testkit::http::Resp) -> bool {
    r.status == 431
        && r.header("content-type") == Some("application/json")
        && r.body == br#"{"error":"request headers too large"}"#
}

#[test]
fn one_header_longer_than_an_environment_string_is_431() {
    let w = Wrapper::start(&length_handler());
    // The longest value that still fits as one string: 200, and the handler has all of it.
    let fits = "v".repeat(MAX_ARG_STRLEN - VAR_PREFIX - 1);
    let r = w.send("GET", "/", &[("X-Big", &fits)], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), format!("{} 1", fits.len()));
    // One byte more, and 128 KiB: 431, not a 500 for a handler that "failed to start".
    for len in [fits.len() + 1, 128 * 1024, 200 * 1024] {
        let r = w.send("GET", "/", &[("X-Big", &"v".repeat(len))], b"");
        assert!(is_431(&r), "{len}: {} {}", r.status, r.text());
    }
    // The wrapper goes on serving.
    assert_eq!(w.get("/").status, 200);
}

#[test]
fn headers_that_together_exceed_what_execve_takes_are_431() {
    // Under a 512 KiB stack limit the kernel takes 128 KiB of arguments and environment in all
    // (a quarter of the stack, but never less than 128 KiB): three 50 KiB headers do not fit,
    // one does.
    let mut cmd = Command::new("bash");
    cmd.args(["-c", "ulimit -s 512 && exec \"$0\"", bin()]);
    let w = Wrapper::start_with(cmd, &length_handler());
    let value = "v".repeat(50 * 1024);
    let r = w.send("GET", "/", &[("X-Big", &value)], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), format!("{} 1", value.len()));
    let r = w.send(
        "GET",
        "/",
        &[("X-Big", &value), ("X-Two", &value), ("X-Three", &value)],
        b"",
    );
    assert!(is_431(&r), "{} {}", r.status, r.text());
    assert_eq!(w.get("/").status, 200);
}

#[test]
fn persistent_mode_passes_long_headers_in_the_envelope() {
    let w = Wrapper::start(&env("persistent", &[&fixtures().path("echo_worker")]));
    let value = "v".repeat(200 * 1024);
    let r = w.send("POST", "/", &[("X-Big", &value)], b"hi");
    assert_eq!((r.status, r.text().as_str()), (200, "hi"));
}

#[test]
fn names_that_map_to_one_variable_are_joined_not_overwritten() {
    let f = fixtures();
    let w = Wrapper::start(&env("exec", &["python3", &f.path("env.py")]));
    let r = w.send(
        "GET",
        "/",
        &[("X-User", "alice"), ("X_User", "admin"), ("x-user", "bob")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Every value reaches the handler; a later spelling cannot replace what a gateway set.
    assert_eq!(r.json()["RUNR_HEADER_X_USER"], "alice, bob, admin");
    // The envelope keeps each name as it came.
    let w = Wrapper::start(&env("exec", &["cat"]));
    let e = w
        .send("GET", "/", &[("X-User", "alice"), ("X_User", "admin")], b"")
        .json();
    assert_eq!(e["headers"]["x-user"], "alice");
    assert_eq!(e["headers"]["x_user"], "admin");
}
