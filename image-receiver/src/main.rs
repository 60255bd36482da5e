//! runr-image-upload: parse the subcommand and the environment, set up logs, run, map the result
//! to an exit status (2 for bad configuration or usage, 1 for a failure at run time).

use std::path::Path;
use std::process::ExitCode;

use runr_image_upload::config::Config;

/// Status for bad configuration and bad usage, as the platform expects.
const EXIT_CONFIG: u8 = 2;

fn main() -> ExitCode {
    // First, while the process has one thread: it may set SSL_CERT_FILE (see
    // runr_registry::roots for why a scratch image needs it).
    if let Err(e) = runr_registry::ensure_system_roots() {
        eprintln!("warning: cannot provide the built-in CA roots as a system store: {e}");
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None | Some("serve") if args.len() <= 1 => serve(),
        Some("fetch") => match &args[1..] {
            [reference, dest] => fetch(reference, Path::new(dest)),
            _ => usage("fetch needs two arguments: <reference> <dest-file>"),
        },
        Some("version" | "--version" | "-V" | "help" | "--help" | "-h") => {
            print!("{}", version());
            ExitCode::SUCCESS
        }
        Some(other) => usage(&format!("unknown subcommand or arguments: {other:?}")),
        None => usage("unexpected arguments"),
    }
}

fn serve() -> ExitCode {
    let lookup = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    let config = match Config::from_lookup(lookup) {
        Ok(config) => config,
        Err(errors) => {
            init_logs(tracing::Level::INFO);
            for e in &errors.0 {
                tracing::error!("invalid configuration: {e}");
            }
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    init_logs(config.log_level);
    let result = runtime().and_then(|rt| {
        rt.block_on(runr_image_upload::serve::serve(config))
            .map_err(anyhow::Error::from)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("serve failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn fetch(reference: &str, dest: &Path) -> ExitCode {
    init_logs(tracing::Level::INFO);
    let lookup = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    let mut errors = Vec::new();
    let registry = runr_registry::RegistryConfig::from_lookup(&lookup, &mut errors);
    if !errors.is_empty() {
        for e in &errors {
            tracing::error!("invalid configuration: {e}");
        }
        return ExitCode::from(EXIT_CONFIG);
    }
    let result = runtime().and_then(|rt| {
        rt.block_on(runr_image_upload::image::fetch::fetch(
            reference, dest, &registry,
        ))
        .map_err(anyhow::Error::from)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("fetch failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Two worker threads: one core receives (HTTP, pwrite) while the other hashes or pushes.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

fn version() -> String {
    format!(
        "runr-image-upload {}\n\nUsage:\n  runr-image-upload [serve]\n  runr-image-upload fetch <reference> <dest-file>\n  runr-image-upload version\n\n{}",
        env!("CARGO_PKG_VERSION"),
        Config::help()
    )
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("runr-image-upload: {problem}\n\n{}", version());
    ExitCode::from(EXIT_CONFIG)
}

/// Logs go to stderr, one line per event.
fn init_logs(level: tracing::Level) {
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .try_init();
}
