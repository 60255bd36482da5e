//! rediss://: TLS verified against the built-in roots, plus RUNR_QUEUE_REDIS_CA_FILE for a Redis
//! behind a private CA.

use runr_testkit::pki::Ca;
use runr_testkit::redis::Redis;

use crate::support::*;

#[test]
fn rediss_needs_a_trusted_certificate_and_then_delivers() {
    let dir = tmp();
    let ca = Ca::new("runr-queue test CA");
    let redis = Redis::start_tls(&ca);
    let receiver = Receiver::start(dir.path(), &[]);
    let env = |name: &str| {
        with(
            base_env(&redis, &receiver.url(), name),
            &[("RUNR_QUEUE_REDIS_URL", &redis.tls_url())],
        )
    };
    // A private CA is none of the built-in roots: the handshake fails, and is waited out.
    let mut untrusting = Consumer::spawn(dir.path(), "untrusting", &env("untrusting"));
    untrusting.wait_log("redis is unavailable");
    let log = untrusting.log();
    eprintln!("{}", untrusting.lines_with("redis is unavailable")[0]);
    assert!(log.to_lowercase().contains("certificate"), "{log}");
    assert!(!log.contains("consuming"), "{log}");
    assert!(untrusting.running());

    let mut c = Consumer::start(
        dir.path(),
        "trusting",
        &with(
            env("trusting"),
            &[("RUNR_QUEUE_REDIS_CA_FILE", ca.cert_file().to_str().unwrap())],
        ),
    );
    let id = redis.conn().xadd(STREAM, &[("over", "tls")]);
    wait_all_acked(&redis, &receiver, std::slice::from_ref(&id));
    receiver.assert_no_problems();
    c.stop_cleanly();
    assert!(!untrusting.log().contains("consuming"));
}
