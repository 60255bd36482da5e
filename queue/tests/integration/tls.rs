//! rediss://: TLS verified against the built-in roots, plus RUNR_QUEUE_REDIS_CA_FILE for a Redis
//! behind a private CA, and a client certificate (RUNR_QUEUE_REDIS_CERT_FILE/_KEY_FILE) for one
//! that requires it.

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

/// `openssl` in `dir`; panics with its output when it fails.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate (clientAuth), in `dir`:
/// ca.crt, server.crt/.key, client.crt/.key.
fn mutual_tls_files(dir: &std::path::Path) {
    let key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut ca = vec![
        "req", "-x509", "-new", "-keyout", "ca.key", "-out", "ca.crt",
    ];
    ca.extend(key);
    ca.extend([
        "-subj",
        "/CN=runr-queue mTLS test CA",
        "-days",
        "2",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    ]);
    openssl(dir, &ca);
    for (name, usage, san) in [
        ("server", "serverAuth", "subjectAltName=IP:127.0.0.1\n"),
        ("client", "clientAuth", ""),
    ] {
        let (k, csr, crt, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        std::fs::write(
            dir.join(&ext),
            format!("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n{san}"),
        )
        .unwrap();
        let mut req = vec!["req", "-new", "-keyout", &k, "-out", &csr, "-subj"];
        let cn = format!("/CN={name}");
        req.push(&cn);
        req.extend(key);
        openssl(dir, &req);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
    }
}

#[test]
fn a_redis_that_requires_client_certificates() {
    use runr_testkit::{free_port, wait_for, Child};
    let dir = tmp();
    let d = dir.path();
    mutual_tls_files(d);
    // A redis-server of our own: the testkit's asks no client certificate.
    let (port, tls_port) = (free_port(), free_port());
    let p = |f: &str| d.join(f).to_str().unwrap().to_string();
    let mut server = std::process::Command::new("redis-server");
    server
        .args([
            "--port",
            &port.to_string(),
            "--tls-port",
            &tls_port.to_string(),
        ])
        .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
        .args([
            "--tls-cert-file",
            &p("server.crt"),
            "--tls-key-file",
            &p("server.key"),
        ])
        .args([
            "--tls-ca-cert-file",
            &p("ca.crt"),
            "--tls-auth-clients",
            "yes",
        ])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            d.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let _server = Child::spawn(&mut server).expect("spawn redis-server");
    let plain = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    runr_testkit::wait_for_port(plain, LONG);
    let receiver = Receiver::start(d, &[]);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let env = |name: &str, extra: &[(&str, &str)]| {
        let mut vars = vec![
            ("RUNR_QUEUE_REDIS_URL".to_string(), url.clone()),
            ("RUNR_QUEUE_REDIS_CA_FILE".to_string(), p("ca.crt")),
            ("RUNR_QUEUE_STREAM".to_string(), STREAM.to_string()),
            ("RUNR_QUEUE_GROUP".to_string(), GROUP.to_string()),
            ("RUNR_QUEUE_CONSUMER".to_string(), name.to_string()),
            ("RUNR_QUEUE_TARGET".to_string(), receiver.url()),
            ("RUNR_QUEUE_LOG".to_string(), "debug".to_string()),
        ];
        vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        vars
    };
    // Without a client certificate the server ends the handshake: waited out, never consuming.
    let mut anonymous = Consumer::spawn(d, "anonymous", &env("anonymous", &[]));
    anonymous.wait_log("redis is unavailable");
    let line = anonymous.lines_with("redis is unavailable").remove(0);
    assert!(line.contains("CertificateRequired"), "{line}");
    assert!(anonymous.running());
    let (cert, key) = (p("client.crt"), p("client.key"));
    let mut c = Consumer::start(
        d,
        "mtls",
        &env(
            "mtls",
            &[
                ("RUNR_QUEUE_REDIS_CERT_FILE", &cert),
                ("RUNR_QUEUE_REDIS_KEY_FILE", &key),
            ],
        ),
    );
    // An entry through the plain port (the test's own client), delivered over mutual TLS.
    let mut s = std::net::TcpStream::connect(plain).unwrap();
    use std::io::{Read, Write};
    s.write_all(b"*5\r\n$4\r\nXADD\r\n$6\r\norders\r\n$1\r\n*\r\n$4\r\nover\r\n$4\r\nmtls\r\n")
        .unwrap();
    let mut reply = [0u8; 64];
    let n = s.read(&mut reply).unwrap();
    let reply = String::from_utf8_lossy(&reply[..n]).to_string();
    let id = reply.lines().nth(1).expect("an id").to_string();
    wait_for("the entry delivered over mutual TLS", LONG, || {
        receiver.succeeded().contains_key(&id).then_some(())
    });
    receiver.assert_no_problems();
    c.stop_cleanly();
    assert!(
        !anonymous.log().contains("consuming"),
        "{}",
        anonymous.log()
    );
}
