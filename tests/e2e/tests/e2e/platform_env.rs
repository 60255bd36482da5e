//! Every binary started in a function container's full environment — what the platform sets
//! there (the runtime contract's container environment, the build's, the wrapper's, the MCP and
//! model variables, Knative's) plus a project's own — logs no "unknown variable" warning, while
//! a misspelt variable of its own still gets one, with the name it meant.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use runr_testkit::redis::Redis;
use runr_testkit::{wait_for, workspace_bin, Child};

/// Generous: the machine running the tests may be loaded.
const LONG: Duration = Duration::from_secs(60);

/// A function container's environment as the platform makes it.
fn container_env() -> Vec<(&'static str, &'static str)> {
    vec![
        // The container environment of every code runtime.
        ("PORT", "0"),
        ("RUNR_TIMEOUT", "30"),
        ("RUNR_TRIGGER", "http"),
        ("RUNR_MODE", "http"),
        ("RUNR_HANDLER", "handler"),
        ("RUNR_FILENAME", "main.sh"),
        // Through the wrapper: the manifest's run section.
        ("RUNR_WRAPPER_MODE", "exec"),
        ("RUNR_COMMAND", r#"["cat"]"#),
        ("RUNR_INPUT", "raw"),
        ("RUNR_WORKERS", "1"),
        // MCP and models.
        ("RUNR_MCP_GATEWAY_KEY", "k-123"),
        (
            "RUNR_MCP_GATEWAY_URL",
            "http://mcp-gateway.runr-system:8080",
        ),
        ("RUNR_MODEL_GPT4_URL", "http://models.runr-system/gpt4"),
        (
            "RUNR_MODEL_EMBED_SMALL_URL",
            "http://models.runr-system/embed-small",
        ),
        // Knative Serving.
        ("K_SERVICE", "orders"),
        ("K_CONFIGURATION", "orders"),
        ("K_REVISION", "orders-00001"),
        // dependencies.env, run.env and the project's own variables.
        ("PYTHONPATH", "/app/vendor"),
        ("GREETING", "hello"),
    ]
}

/// Starts `bin args` with the container's environment and `own` on top, waits until its log
/// holds `ready` (or it exited), stops it and returns the log.
fn log_of(bin: &str, args: &[&str], own: &[(&str, String)], ready: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("out.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new(workspace_bin(bin));
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(container_env())
        .envs(own.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    let mut child = Child::spawn(&mut cmd).unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    wait_for(&format!("{bin} to log {ready:?}"), LONG, || {
        let exited = matches!(child.inner().try_wait(), Ok(Some(_)));
        (read(&log).contains(ready) || exited).then_some(())
    });
    child.kill();
    let text = read(&log);
    assert!(
        text.contains(ready),
        "{bin} never logged {ready:?}:\n{text}"
    );
    text
}

fn warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("unknown variable"))
        .collect()
}

/// One binary: how it starts in a container, what it logs once its configuration was accepted
/// (after the warnings), and one of its variables misspelt with the name it meant.
struct Case {
    bin: &'static str,
    args: &'static [&'static str],
    own: Vec<(&'static str, String)>,
    ready: &'static str,
    typo: (&'static str, &'static str),
}

#[test]
fn no_binary_warns_about_what_the_platform_sets_and_each_still_names_a_typo() {
    let redis = Redis::start();
    let upload_dir = tempfile::tempdir().unwrap();
    let cases = [
        Case {
            bin: "runr-wrapper",
            args: &[],
            own: vec![],
            ready: "listening",
            typo: ("RUNR_TIMOUT", "RUNR_TIMEOUT"),
        },
        Case {
            bin: "runr-tick",
            args: &[],
            // Nothing listens there: it gives up after its wait (the warnings come first).
            own: vec![
                ("RUNR_TICK_URL", "http://127.0.0.1:9/".to_string()),
                ("RUNR_TICK_WAIT", "1s".to_string()),
            ],
            ready: "ERROR",
            typo: ("RUNR_TICK_WAT", "RUNR_TICK_WAIT"),
        },
        Case {
            bin: "runr-queue",
            args: &[],
            own: vec![
                ("RUNR_QUEUE_REDIS_URL", redis.url()),
                ("RUNR_QUEUE_STREAM", "orders".to_string()),
                ("RUNR_QUEUE_GROUP", "orders-api".to_string()),
                ("RUNR_QUEUE_CONSUMER", "c1".to_string()),
                ("RUNR_QUEUE_TARGET", "http://127.0.0.1:9/".to_string()),
            ],
            ready: "consuming",
            typo: ("RUNR_QUEUE_CONCURENCY", "RUNR_QUEUE_CONCURRENCY"),
        },
        Case {
            bin: "runr-image-upload",
            args: &["serve"],
            own: vec![
                ("RUNR_UPLOAD_DIR", upload_dir.path().display().to_string()),
                ("RUNR_UPLOAD_SIZE", "10".to_string()),
                ("RUNR_UPLOAD_SHA256", "ab".repeat(32)),
                (
                    "RUNR_UPLOAD_TARGET",
                    "127.0.0.1:9/runr-uploads/a:b".to_string(),
                ),
            ],
            ready: "listening",
            typo: ("RUNR_UPLOAD_SIZ", "RUNR_UPLOAD_SIZE"),
        },
        Case {
            bin: "runr-prewarm",
            args: &["run"],
            // Nothing listens there: it gives up after its wait.
            own: vec![
                ("RUNR_PREWARM_REGISTRY", "127.0.0.1:9".to_string()),
                ("RUNR_PREWARM_IMAGES", "library/alpine:3.21".to_string()),
                ("RUNR_PREWARM_WAIT", "1s".to_string()),
                ("RUNR_REGISTRY_PLAIN_HTTP", "1".to_string()),
            ],
            ready: "ERROR",
            typo: ("RUNR_PREWARM_ATEMPTS", "RUNR_PREWARM_ATTEMPTS"),
        },
    ];
    for case in &cases {
        let log = log_of(case.bin, case.args, &case.own, case.ready);
        assert_eq!(warnings(&log), Vec::<&str>::new(), "{}:\n{log}", case.bin);

        let (typo, meant) = case.typo;
        let mut own = case.own.clone();
        own.push((typo, "5".to_string()));
        let log = log_of(case.bin, case.args, &own, case.ready);
        let found = warnings(&log);
        assert_eq!(found.len(), 1, "{}:\n{log}", case.bin);
        assert!(
            found[0].contains(&format!("variable={typo}"))
                && found[0].contains(&format!("did_you_mean={meant}")),
            "{}: {}",
            case.bin,
            found[0]
        );
    }
}
