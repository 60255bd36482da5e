//! Log lines on stderr (stdout carries only the JSON summary): `LEVEL message field=value…`,
//! without colours or timestamps, since the Job's log collector adds its own.

use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the global subscriber: prewarm's own events at `level`, the libraries' (HTTP
/// connection pool chatter at debug) at warn only. A second call leaves the first in place.
pub fn init(level: tracing::Level) {
    let filter = Targets::new()
        .with_target(env!("CARGO_CRATE_NAME"), level)
        .with_default(LevelFilter::WARN);
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .with_target(false)
                .without_time(),
        )
        .with(filter)
        .try_init();
}
