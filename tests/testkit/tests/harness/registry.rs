//! The registry fixture: a port taken by another socket by the time docker-registry binds it.

use std::net::TcpListener;
use std::time::Duration;

use runr_testkit::{http_get_status, wait_for, Registry};

/// A registry on a chosen port that another socket holds waits for it instead of failing:
/// the holder lets the port go only once docker-registry has said it is in use.
#[test]
fn a_registry_whose_port_is_held_starts_once_it_is_let_go() {
    if !runr_testkit::tools_present(&["docker-registry"]) {
        return;
    }
    let upstream = Registry::start();
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let refused = format!("127.0.0.1:{port}: bind: address already in use");
    let releaser = std::thread::spawn(move || {
        wait_for(
            "docker-registry to find its port taken",
            Duration::from_secs(60),
            || {
                let dirs = std::fs::read_dir(std::env::temp_dir()).ok()?;
                dirs.flatten()
                    .filter(|d| {
                        d.file_name()
                            .to_string_lossy()
                            .starts_with("runr-registry-")
                    })
                    .any(|d| {
                        std::fs::read_to_string(d.path().join("registry.log"))
                            .is_ok_and(|log| log.contains(&refused))
                    })
                    .then_some(())
            },
        );
        drop(holder);
    });
    let cache = Registry::start_proxy_on_port(&upstream.url(), port);
    releaser.join().unwrap();
    assert_eq!(cache.addr().port(), port);
    assert_eq!(http_get_status(cache.addr(), "/v2/"), Some(200));
}
