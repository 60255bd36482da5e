//! A custom runtime in shell with curl, the shape of AWS's custom-runtime tutorial: found as
//! `$LAMBDA_TASK_ROOT/bootstrap` (no `RUNR_COMMAND`), two runtimes, many clients.

use std::collections::HashSet;

use super::fixture;
use super::support::Function;
use crate::support::{Body, Conn};

#[test]
fn a_shell_bootstrap_found_in_the_task_root_serves_many_clients() {
    let f = Function::start(
        &[
            ("bootstrap", &fixture("bootstrap")),
            ("function.sh", &fixture("function.sh")),
        ],
        &[("RUNR_HANDLER", "function.handler"), ("RUNR_WORKERS", "2")],
    );
    let root = f.root.path().canonicalize().unwrap();
    assert!(
        f.log().contains(&format!(
            r#"command="[\"{}\"]""#,
            root.join("bootstrap").display()
        )),
        "{}",
        f.log()
    );
    f.wait_runtimes(2);
    let addr = f.addr();
    let handles: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                let mut pids = HashSet::new();
                for i in 0..4 {
                    let path = format!("/client-{t}/request-{i}");
                    let r = conn.send("GET", &path, &[], Body::None);
                    assert_eq!(r.status, 200, "{}", r.text());
                    assert_eq!(r.header("content-type"), Some("text/plain"));
                    assert_eq!(r.text(), format!("shell saw {path}"));
                    pids.insert(r.header("x-pid").unwrap().to_string());
                }
                pids
            })
        })
        .collect();
    let mut pids = HashSet::new();
    for h in handles {
        pids.extend(h.join().unwrap());
    }
    assert!(!pids.is_empty() && pids.len() <= 2, "{pids:?}");
}
