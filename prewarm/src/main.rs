//! `runr-prewarm [run|version|help]`: reads the environment, warms the images, prints the JSON
//! summary on stdout and exits 0 (all warmed), 1 (some failed) or 2 (bad configuration).

#![forbid(unsafe_code)]

use std::process::ExitCode;

use runr_prewarm::{Config, EXIT_CONFIG, EXIT_FAILED, EXIT_OK};

fn main() -> ExitCode {
    // First, while the process has one thread: it may set SSL_CERT_FILE (see
    // runr_registry::roots for why a scratch image needs it).
    if let Err(e) = runr_registry::ensure_system_roots() {
        eprintln!("warning: cannot provide the built-in CA roots as a system store: {e}");
    }
    match std::env::args().nth(1).as_deref() {
        None | Some("run") => run(),
        Some("version" | "--version" | "-V") => {
            println!("runr-prewarm {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some("help" | "--help" | "-h") => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("runr-prewarm: unknown subcommand {other:?}\n\n{USAGE}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

fn run() -> ExitCode {
    // Configuration first: a bad variable must stop the Job before anything is contacted.
    let config = match Config::from_lookup(|name| std::env::var(name).ok()) {
        Ok(config) => config,
        Err(errors) => {
            runr_prewarm::log::init(tracing::Level::INFO);
            for e in &errors {
                tracing::error!(variable = e.name, "bad configuration: {e}");
            }
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    runr_prewarm::log::init(config.log);
    // One thread: two workers measured no faster on the 500 MiB benchmark (prewarm spends about
    // 0.5 s of CPU on it; the cache's own copying is the bottleneck) and would take a core from
    // a cache running on the same node. See the README's figures.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    match runtime.block_on(runr_prewarm::run(config)) {
        Ok(summary) => {
            summary.log();
            println!("{}", summary.to_json());
            ExitCode::from(if summary.success() {
                EXIT_OK
            } else {
                EXIT_FAILED
            })
        }
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

const USAGE: &str = "\
runr-prewarm: makes a pull-through cache registry fetch and store images before builds need them.

Usage: runr-prewarm [run|version|help]   (run is the default)

Exit status: 0 every image warmed, 1 some image failed, 2 bad configuration.
Stdout: one JSON summary line. Stderr: log lines.

Environment variables:
  RUNR_PREWARM_REGISTRY       the cache, host[:port] (required)
  RUNR_PREWARM_IMAGES         repository:tag or repository@sha256:… separated by commas,
                              spaces or newlines (required)
  RUNR_PREWARM_PLATFORMS      platforms of an index to warm, os/arch[/variant],… or all (default: all)
  RUNR_PREWARM_ATTEMPTS       tries per image (default: 3)
  RUNR_PREWARM_WAIT           wait for the registry to answer GET /v2/ (default: 300s)
  RUNR_PREWARM_CONCURRENCY    blobs fetched at once across images (default: 4)
  RUNR_PREWARM_TIMEOUT        time per image (default: 1800s)
  RUNR_PREWARM_BACKOFF        first pause between attempts, doubling (default: 5s)
  RUNR_PREWARM_CONFIRM_WAIT   wait for the cache to store what it served (default: 60s)
  RUNR_PREWARM_LOG            error, warn, info or debug (default: info)
  RUNR_REGISTRY_PLAIN_HTTP    1 for a registry without TLS (default: 0)
  RUNR_REGISTRY_USERNAME      user for basic auth and the token flow (default: none)
  RUNR_REGISTRY_PASSWORD      its password (default: none)
  RUNR_REGISTRY_CA_FILE       extra CA certificates, PEM (default: none)
Durations take ms, s, m or h; a bare number is seconds.
";
