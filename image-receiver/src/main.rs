//! runr-image-upload: parse the subcommand and the environment, set up logs, run, map the result
//! to an exit status (2 for bad configuration or usage, 1 for a failure at run time).

use std::future::Future;
use std::path::Path;
use std::process::ExitCode;

use runr_base::cli::{self, Ask};
use runr_base::env::{process_lookup, ConfigErrors};
use runr_base::fmt::error_chain;
use runr_base::log::LogFormat;
use runr_image_upload::config::{self, Config};

/// It runs as a Job whose log collector adds no timestamps: the lines carry their own.
const LOG: LogFormat = LogFormat {
    prefix: "runr-image-upload",
    info_level: true,
    timestamps: true,
};

/// Threads for blocking work: the batch writes of concurrent chunks (at most 8 batches exist) and
/// the pipeline's (four blobs at a time reading, one layer compressing on two threads of its own).
const BLOCKING_THREADS: usize = 12;

fn main() -> ExitCode {
    // First, while the process has one thread: it may set SSL_CERT_FILE (see
    // runr_registry::roots for why a scratch image needs it).
    if let Err(e) = runr_registry::ensure_system_roots() {
        eprintln!("warning: cannot provide the built-in CA roots as a system store: {e}");
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    match Ask::of(args.first().map(String::as_str)) {
        Ask::Default | Ask::Command("serve") if args.len() <= 1 => serve(),
        Ask::Command("fetch") => match &args[1..] {
            [reference, dest] => fetch(reference, Path::new(dest)),
            _ => usage("fetch needs two arguments: <reference> <dest-file>"),
        },
        Ask::Version | Ask::Help => cli::print_usage(&version()),
        Ask::Command(other) => usage(&format!("unknown subcommand or arguments: {other:?}")),
        Ask::Default => usage("unexpected arguments"),
    }
}

fn serve() -> ExitCode {
    let config = match configure(Config::from_lookup(&process_lookup)) {
        Ok(config) => config,
        Err(code) => return code,
    };
    runr_base::log::init(LOG, config.log_level);
    runr_base::env::warn_unknown(
        &["RUNR_UPLOAD_", "RUNR_REGISTRY_"],
        &[config::VARS, runr_registry::config::VARS],
    );
    run("serve", runr_image_upload::serve::serve(config))
}

fn fetch(reference: &str, dest: &Path) -> ExitCode {
    let registry = match configure(config::registry_from_lookup(&process_lookup)) {
        Ok(registry) => registry,
        Err(code) => return code,
    };
    runr_base::log::init(LOG, tracing::Level::INFO);
    run(
        "fetch",
        runr_image_upload::image::fetch::fetch(reference, dest, &registry),
    )
}

/// Runs `work` on two worker threads: one core receives (HTTP, pwrite) while the other hashes
/// or pushes. Blocking work (batched data-file writes, detection, compression, blob reads) gets
/// at most [`BLOCKING_THREADS`]: each thread costs memory (its stack, and an allocator arena),
/// and more than that cannot run at once on two cores anyway.
fn run<E>(what: &str, work: impl Future<Output = Result<(), E>>) -> ExitCode
where
    E: std::error::Error + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build();
    let result = match runtime {
        Ok(rt) => rt.block_on(work).map_err(|e| error_chain(&e)),
        Err(e) => Err(format!("cannot start the runtime: {e}")),
    };
    cli::finish(what, result)
}

/// The configuration, or one line per bad variable and exit 2.
fn configure<C>(parsed: Result<C, ConfigErrors>) -> Result<C, ExitCode> {
    cli::configure(parsed, || runr_base::log::init(LOG, tracing::Level::INFO))
}

fn version() -> String {
    format!(
        "runr-image-upload {}\n\nUsage:\n  runr-image-upload [serve]\n  runr-image-upload fetch <reference> <dest-file>\n  runr-image-upload version\n\n{}\n(fetch reads only the RUNR_REGISTRY_* variables.)\n",
        env!("CARGO_PKG_VERSION"),
        config::help()
    )
}

fn usage(problem: &str) -> ExitCode {
    cli::usage_error("runr-image-upload", problem, &version())
}
