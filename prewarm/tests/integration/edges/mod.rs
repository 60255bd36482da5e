//! At the edges of a real registry: SIGTERM/SIGINT mid-transfer, Bearer-token auth (right and
//! wrong credentials), TLS with good and bad certificates, and a cache that ignores `Range`.

mod range;
mod signals;
mod tls;
mod token;

use std::process::Command;

/// `skopeo copy docker://<host>/<image> dir:…` with `args` before the copy's arguments (e.g.
/// credentials, a cert dir); the error output when it fails.
pub fn pull(host: &str, image: &str, args: &[&str]) -> Result<(), String> {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new("skopeo")
        .args(["--insecure-policy", "copy", "--retry-times", "0"])
        .args(args)
        .args([
            &format!("docker://{host}/{image}"),
            &format!("dir:{}", out_dir.path().display()),
        ])
        .output()
        .expect("run skopeo");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The variables of `env` with `extra` set (replacing any earlier value).
pub fn with(env: &[(String, String)], extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| !extra.iter().any(|(name, _)| name == k))
        .cloned()
        .collect();
    out.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    out
}
