//! Resume after SIGKILL, verification (mismatch reopens), results that outlive a restart, and
//! a real push of a wasm module.

use std::time::Duration;

use nix::sys::signal::Signal;
use runr_testkit::Registry;

use crate::support::*;

#[test]
fn resumes_after_sigkill_with_the_same_counts() {
    let data = random_bytes(4 * MIB + 999, 10);
    let (_tmp, dir) = work_dir();
    let mut r = Receiver::for_data(&dir, &data, &[]);
    // The first MiB, and a piece in the middle: a prefix and a gap.
    assert_eq!(r.put(0, &data[..MIB]).0, 200);
    assert_eq!(r.put(2 * MIB as u64, &data[2 * MIB..3 * MIB]).0, 200);
    let before = r.status();
    assert_eq!(before["uploaded_bytes"], MIB as u64);
    assert_eq!(before["received_bytes"], 2 * MIB as u64);

    r.kill9_and_restart();
    let after = r.status();
    assert_eq!(
        after, before,
        "a restarted receiver must report what it answered"
    );

    // The client goes on from uploaded_bytes; the running digest covers what came before the
    // kill (re-hashed once at start).
    assert_eq!(r.put(MIB as u64, &data[MIB..2 * MIB]).0, 200);
    assert_eq!(r.status()["uploaded_bytes"], 3 * MIB as u64);
    r.kill9_and_restart();
    assert_eq!(r.put(3 * MIB as u64, &data[3 * MIB..]).0, 200);
    assert_eq!(r.status()["uploaded_bytes"], data.len() as u64);
    assert!(r.data_file() == data);
    assert_eq!(r.complete().0, 202);
    let s = r.wait_status("verification to pass", |s| s["status"] == "failed");
    assert!(!s["message"].as_str().unwrap().contains("SHA-256"), "{s}");

    // The result outlives a restart too: the control plane may poll a new container.
    r.kill9_and_restart();
    let again = r.status();
    assert_eq!(again, s);
    assert_eq!(r.complete().0, 200);
}

#[test]
fn sigkill_mid_chunk_claims_nothing_of_it() {
    use std::io::Write;
    let data = random_bytes(4 * MIB, 13);
    let (_tmp, dir) = work_dir();
    let mut r = Receiver::for_data(&dir, &data, &[]);
    assert_eq!(r.put(0, &data[..MIB]).0, 200);
    // Most of a 2 MiB chunk: its first batch reaches the data file, the chunk never ends.
    let mut s = std::net::TcpStream::connect(r.addr).unwrap();
    write!(
        s,
        "PUT /chunk?offset={MIB} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        2 * MIB
    )
    .unwrap();
    s.write_all(&data[MIB..MIB + MIB + MIB / 2]).unwrap();
    let file = dir.join("upload.data");
    runr_testkit::wait_for(
        "the chunk's first batch on disk",
        Duration::from_secs(20),
        || {
            let len = std::fs::metadata(&file).ok()?.len();
            (len > MIB as u64).then_some(())
        },
    );
    r.kill9_and_restart();
    drop(s);
    let st = r.status();
    assert_eq!(st["uploaded_bytes"], MIB as u64, "{st}");
    assert_eq!(st["received_bytes"], MIB as u64, "{st}");
    // Sent again whole, it counts.
    assert_eq!(r.put(MIB as u64, &data[MIB..]).0, 200);
    assert_eq!(r.complete().0, 202);
    let st = r.wait_status("verification to pass", |s| s["status"] == "failed");
    assert!(!st["message"].as_str().unwrap().contains("SHA-256"), "{st}");
}

#[test]
fn state_of_another_upload_is_discarded() {
    let data = random_bytes(MIB, 11);
    let (_tmp, dir) = work_dir();
    {
        let r = Receiver::for_data(&dir, &data, &[]);
        assert_eq!(r.put(0, &data[..1000]).0, 200);
    }
    // Same directory, another declared file.
    let other = random_bytes(MIB, 12);
    let r = Receiver::for_data(&dir, &other, &[]);
    let s = r.status();
    assert_eq!(s["status"], "ready", "{s}");
    assert_eq!(s["received_bytes"], 0, "{s}");
    assert!(r.log().contains("another upload"), "{}", r.log());
}

#[test]
fn digest_mismatch_reopens_the_upload() {
    let data = random_bytes(2 * MIB, 20);
    let declared = sha256_hex(b"something else");
    let (_tmp, dir) = work_dir();
    let r = Receiver::for_data(&dir, &data, &[("RUNR_UPLOAD_SHA256", &declared)]);
    assert_eq!(r.put(MIB as u64, &data[MIB..]).0, 200);
    assert_eq!(r.put(0, &data[..MIB]).0, 200);
    let (code, body) = r.complete();
    assert_eq!(code, 202, "{body}");
    let s = r.wait_status("the upload to be reopened", |s| {
        s["status"] == "ready" && s["message"].is_string()
    });
    assert_eq!(s["uploaded_bytes"], 0);
    assert_eq!(s["received_bytes"], 0);
    let message = s["message"].as_str().unwrap();
    let actual = sha256_hex(&data);
    assert!(message.contains(&actual), "{message}");
    assert!(message.contains(&declared), "{message}");
    assert!(r.data_file().is_empty(), "the space is given back");

    // The upload takes chunks again, and completing it again checks again.
    assert_eq!(r.complete().0, 409);
    assert_eq!(r.put(0, &data).0, 200);
    assert_eq!(r.status()["uploaded_bytes"], data.len() as u64);
    assert_eq!(r.complete().0, 202);
    r.wait_status("the second check", |s| {
        s["status"] == "ready" && s["received_bytes"] == 0
    });
}

#[test]
fn sigterm_stops_cleanly() {
    let data = random_bytes(1000, 30);
    let (_tmp, dir) = work_dir();
    let mut r = Receiver::for_data(&dir, &data, &[]);
    r.signal(Signal::SIGTERM);
    let status = r.wait_exit(Duration::from_secs(15));
    assert!(status.success(), "{status}: {}", r.log());
}

#[test]
fn a_push_cut_by_sigkill_is_resumed_after_restart() {
    let mut registry = Registry::start();
    registry.stop();
    // Something that accepts connections on the registry's port and never answers: the push
    // hangs, so the receiver is reliably killed while `pushing`.
    let black_hole = std::net::TcpListener::bind(registry.addr()).expect("bind the registry port");
    let module = b"\0asm\x01\0\0\0".to_vec();
    let target = format!("{}/runr-uploads/test/cut:1", registry.host());
    let (_tmp, dir) = work_dir();
    let mut r = Receiver::for_data(&dir, &module, &[("RUNR_UPLOAD_TARGET", &target)]);
    assert_eq!(r.put(0, &module).0, 200);
    assert_eq!(r.complete().0, 202);
    r.wait_status("the push to start", |s| s["status"] == "pushing");
    r.kill9();
    drop(black_hole);
    registry.restart();
    r.restart();
    let s = r.finished();
    assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
    assert_eq!(s["image"]["tag_ref"], target);
    assert!(r.log().contains("starting that again"), "{}", r.log());
}

#[test]
fn a_registry_with_basic_auth_takes_the_push_with_the_right_credentials_only() {
    let registry = Registry::start_with_basic_auth("runr", "s3cret");
    let module = b"\0asm\x01\0\0\0".to_vec();
    let target = format!("{}/runr-uploads/test/auth:1.0", registry.host());
    for (password, expect) in [("wrong", "failed"), ("s3cret", "completed")] {
        let (_tmp, dir) = work_dir();
        let r = Receiver::for_data(
            &dir,
            &module,
            &[
                ("RUNR_UPLOAD_TARGET", &target),
                ("RUNR_REGISTRY_USERNAME", "runr"),
                ("RUNR_REGISTRY_PASSWORD", password),
            ],
        );
        assert_eq!(r.put(0, &module).0, 200);
        assert_eq!(r.complete().0, 202);
        let s = r.finished();
        assert_eq!(s["status"], expect, "{s}\n{}", r.log());
        if expect == "failed" {
            // The user is told it is about the registry's credentials, not the file.
            let message = s["message"].as_str().unwrap_or_default().to_lowercase();
            assert!(
                message.contains("auth")
                    || message.contains("401")
                    || message.contains("credential"),
                "{s}"
            );
        }
    }
    let inspect = runr_testkit::skopeo(&[
        "inspect",
        "--tls-verify=false",
        "--creds",
        "runr:s3cret",
        "--raw",
        &format!("docker://{target}"),
    ]);
    assert!(inspect.contains("application/wasm"), "{inspect}");
}

#[test]
fn wasm_module_is_pushed_and_its_digest_read_back() {
    let registry = Registry::start();
    // The smallest valid module: magic and version.
    let module = b"\0asm\x01\0\0\0".to_vec();
    let target = format!("{}/runr-uploads/test/q:1.0", registry.host());
    let (_tmp, dir) = work_dir();
    let r = Receiver::for_data(
        &dir,
        &module,
        &[
            ("RUNR_UPLOAD_TARGET", &target),
            ("RUNR_UPLOAD_FILENAME", "q.wasm"),
            ("RUNR_UPLOAD_NAME", "q:1.0"),
        ],
    );
    assert_eq!(r.put(4, &module[4..]).0, 200);
    assert_eq!(r.put(0, &module[..4]).0, 200);
    let s = r.completed();
    let image = &s["image"];
    assert_eq!(image["kind"], "wasm", "{s}");
    assert_eq!(image["source_format"], "wasm", "{s}");
    assert_eq!(image["tag_ref"], target, "{s}");
    let digest = image["digest"].as_str().unwrap();
    // The registry has the tag, at the digest the receiver reports.
    let inspect = runr_testkit::skopeo(&[
        "inspect",
        "--tls-verify=false",
        "--raw",
        &format!("docker://{target}"),
    ]);
    assert_eq!(format!("sha256:{}", sha256_hex(inspect.as_bytes())), digest);
}
