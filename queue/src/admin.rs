//! The operator's subcommands: `create-group` (the group ahead of any consumer, e.g. from an
//! init container, so an autoscaler that starts consumers from zero finds it) and `redrive`
//! (dead letters back to the stream). Both read the consumer's variables (only Redis, the stream
//! and the group are required) and wait out a Redis that is not there yet, like the consumer.

use std::process::ExitCode;

use crate::config::{self, Config, Role};
use crate::store::{Refusal, Store};
use crate::{Ended, EXIT_FATAL, LOG_FORMAT};

/// The configuration of an admin command, or its exit status (2, with one line per bad variable).
fn config_for_admin(get: &dyn Fn(&str) -> Option<String>) -> Result<Config, ExitCode> {
    let c = runr_base::cli::configure(Config::for_role(get, Role::Admin), || {
        runr_base::log::init(LOG_FORMAT, tracing::Level::INFO)
    })?;
    runr_base::log::init(LOG_FORMAT, c.log_level);
    runr_base::env::warn_unknown(&["RUNR_QUEUE_"], &[config::VARS]);
    Ok(c)
}

/// Runs `work` with a store for `config` until it ends or SIGTERM/SIGINT; the exit status.
fn run_admin<F>(config: &Config, work: impl FnOnce(Store) -> F) -> ExitCode
where
    F: std::future::Future<Output = Result<(), Refusal>>,
{
    let ended = runr_base::runtime::block_on(async {
        crate::roots::install_crypto_provider();
        let shutdown = match runr_base::signal::shutdown() {
            Ok(s) => s,
            Err(e) => return Ended::Fatal(format!("cannot install the signal handlers: {e}")),
        };
        let store = match Store::new(config) {
            Ok(s) => s,
            Err(e) => return Ended::Fatal(e.to_string()),
        };
        tokio::select! {
            r = work(store) => match r {
                Ok(()) => Ended::Stopped { drained: true },
                Err(r) => {
                    tracing::error!(command = %r.command, key = %r.key, error = %r.error, "redis refused a command");
                    Ended::Fatal(r.to_string())
                }
            },
            signal = shutdown => {
                tracing::info!(signal = %signal, "stopped before the end");
                Ended::Stopped { drained: false }
            }
        }
    });
    match ended {
        Some(Ended::Stopped { .. }) => runr_base::cli::Exit::Done.into(),
        Some(Ended::Fatal(_)) | None => EXIT_FATAL.into(),
    }
}

/// `runr-queue create-group`: `XGROUP CREATE <stream> <group> <RUNR_QUEUE_START> MKSTREAM`
/// unless the group exists (which is no error: the command can run before every pod start).
pub fn create_group(get: &dyn Fn(&str) -> Option<String>) -> ExitCode {
    let config = match config_for_admin(get) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let c = config.clone();
    run_admin(&config, |store| async move {
        let config = c;
        let created = store.retry(|| store.create_group()).await?;
        if created {
            println!(
                "created group {} on stream {} at {}",
                config.group, config.stream, config.start
            );
        } else {
            println!(
                "group {} on stream {} exists: left as it is",
                config.group, config.stream
            );
        }
        Ok(())
    })
}

// === redrive ===

/// What `runr-queue redrive` moves: at most `count` dead letters with ids from `from` to `to`
/// (inclusive), of those that match `only`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redrive {
    /// At most this many (all when `None`).
    pub count: Option<u64>,
    /// The first id (`-`: the oldest).
    pub from: String,
    /// The last id (`+`: the newest when the command starts; dead letters made while it runs
    /// are left for the next run, so entries that fail again are not moved round and round).
    pub to: String,
    /// Only dead letters whose `runr-error` or `runr-status` is listed.
    pub only: Option<Only>,
}

/// A `--only` list: error classes and statuses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Only {
    /// `runr-error` values, lower case.
    pub classes: Vec<String>,
    /// `runr-status` values (0: no answer).
    pub statuses: Vec<u16>,
}

/// The usage line of `redrive`.
pub const REDRIVE_USAGE: &str =
    "runr-queue redrive [--count N] [--from ID] [--to ID] [--only CLASS|STATUS,...]";

/// A field of an entry: name and value, the bytes Redis stores.
type Field = (Vec<u8>, Vec<u8>);

/// Dead letters read per `XRANGE`.
const PAGE: usize = 100;

/// `redrive`'s arguments.
pub fn parse_redrive_args(args: &[String]) -> Result<Redrive, String> {
    let mut r = Redrive {
        count: None,
        from: "-".to_string(),
        to: "+".to_string(),
        only: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--count" => {
                let v = value()?;
                r.count = Some(
                    runr_base::env::parse_count(&v, &(1..=u64::MAX))
                        .map_err(|e| format!("--count {v:?}: {e}"))?,
                );
            }
            "--from" => r.from = range_id(flag, &value()?, "-")?,
            "--to" => r.to = range_id(flag, &value()?, "+")?,
            "--only" => r.only = Some(parse_only(&value()?)?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(r)
}

/// An id bound of `XRANGE`: `open` (`-` or `+`), `<ms>` or `<ms>-<seq>`.
fn range_id(flag: &str, v: &str, open: &str) -> Result<String, String> {
    if v == open || (v != "$" && config::parse_start(v).is_ok()) {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{flag} {v:?}: expected an entry id such as 1700000000000-0 (or {open})"
        ))
    }
}

/// `timeout,500,0`: `runr-error` classes (what the consumer writes: the wrapper's classes,
/// `timeout`, `unreachable`, `limit`, `encoding`, `abandoned`) and statuses 0 to 599.
fn parse_only(v: &str) -> Result<Only, String> {
    let mut out = Only::default();
    for item in v.split(',').map(str::trim) {
        if item.bytes().all(|b| b.is_ascii_digit()) && !item.is_empty() {
            match item.parse::<u16>() {
                Ok(s @ 0..=599) => out.statuses.push(s),
                _ => return Err(format!("--only: {item:?} is not a status from 0 to 599")),
            }
        } else if let Some(class) = crate::answer::parse_error_class(item.as_bytes()) {
            out.classes.push(class);
        } else {
            return Err(format!(
                "--only: {item:?} is neither a status nor an error class (letters, digits, . _ -)"
            ));
        }
    }
    Ok(out)
}

impl Only {
    fn matches(&self, meta: &[(Vec<u8>, Vec<u8>)]) -> bool {
        let value = |name: &str| {
            meta.iter()
                .rev()
                .find(|(n, _)| n == name.as_bytes())
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        let class = value("runr-error");
        let status = value("runr-status").and_then(|s| s.parse::<u16>().ok());
        class.is_some_and(|c| !c.is_empty() && self.classes.contains(&c))
            || status.is_some_and(|s| self.statuses.contains(&s))
    }
}

/// A dead letter's own fields and the consumer's metadata after them: the trailing fields named
/// in [`DEAD_LETTER_FIELDS`], each at most once (an entry's own field of such a name, before
/// them, stays its own).
pub(crate) fn split_dead_letter(fields: &[Field]) -> (&[Field], &[Field]) {
    let mut seen: Vec<&[u8]> = Vec::new();
    let mut n = fields.len();
    while n > 0 {
        let name = fields[n - 1].0.as_slice();
        let ours = crate::consumer::DEAD_LETTER_FIELDS
            .iter()
            .any(|f| f.as_bytes() == name);
        if !ours || seen.contains(&name) {
            break;
        }
        seen.push(name);
        n -= 1;
    }
    fields.split_at(n)
}

/// The newer of two ids Redis compares (`<ms>-<seq>`); `a` when either is not one.
fn older(a: &str, b: &str) -> String {
    match (crate::store::parse_id(a), crate::store::parse_id(b)) {
        (Some(x), Some(y)) if y < x => b.to_string(),
        _ => a.to_string(),
    }
}

/// `runr-queue redrive`: dead letters back to the stream as new entries, with their own fields
/// (the consumer's `runr-*` metadata stripped), each in one `MULTI`/`EXEC` (`XDEL` + `XADD`).
/// Prints how many it moved, also when stopped by a signal or a refusal.
pub fn redrive(get: &dyn Fn(&str) -> Option<String>, args: &[String]) -> ExitCode {
    let spec = match parse_redrive_args(args) {
        Ok(s) => s,
        Err(e) => {
            let usage = format!("usage: {REDRIVE_USAGE}");
            return runr_base::cli::usage_error("runr-queue", &e, &usage);
        }
    };
    let config = match config_for_admin(get) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let moved = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = moved.clone();
    let code = run_admin(&config, |store| async move {
        redrive_all(&store, &spec, &counter).await
    });
    println!(
        "moved {} dead letters from {} to {}",
        moved.load(std::sync::atomic::Ordering::Relaxed),
        config.dead_letter_stream(),
        config.stream
    );
    code
}

async fn redrive_all(
    store: &Store,
    spec: &Redrive,
    moved: &std::sync::atomic::AtomicU64,
) -> Result<(), Refusal> {
    use std::sync::atomic::Ordering;
    let dlq = store.dead_letters.clone();
    let Some(newest) = store.retry(|| store.newest(&dlq)).await? else {
        return Ok(());
    };
    let end = if spec.to == "+" {
        newest
    } else {
        older(&spec.to, &newest)
    };
    let mut start = spec.from.clone();
    let full = || {
        spec.count
            .is_some_and(|c| moved.load(Ordering::Relaxed) >= c)
    };
    while !full() {
        let page = store
            .retry(|| store.range(&dlq, &start, &end, PAGE))
            .await?;
        let Some(last) = page.last() else { break };
        start = format!("({}", last.id);
        for entry in page {
            if full() {
                break;
            }
            let Some(fields) = entry.fields.as_deref() else {
                continue;
            };
            let (own, meta) = split_dead_letter(fields);
            if spec.only.as_ref().is_some_and(|o| !o.matches(meta)) {
                continue;
            }
            if own.is_empty() {
                tracing::warn!(id = %entry.id, "a dead letter with no fields of its own: left where it is");
                continue;
            }
            move_one(store, &entry.id, own).await?;
            moved.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(id = %entry.id, "redriven");
        }
    }
    Ok(())
}

/// One dead letter back, waiting out Redis; after a failure whose outcome is unknown (the
/// connection dropped around `EXEC`), the dead letter's absence says it moved.
async fn move_one(store: &Store, id: &str, fields: &[(Vec<u8>, Vec<u8>)]) -> Result<(), Refusal> {
    let mut pause = std::time::Duration::from_millis(50);
    loop {
        match store.redrive(id, fields).await {
            Ok(()) => return Ok(()),
            Err(crate::store::StoreError::Fatal(r)) => return Err(r),
            Err(_) => {}
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_secs(1));
        let dlq = &store.dead_letters;
        if store
            .retry(|| store.range(dlq, id, id, 1))
            .await?
            .is_empty()
        {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn redrive_arguments() {
        let all = parse_redrive_args(&[]).unwrap();
        assert_eq!(
            all,
            Redrive {
                count: None,
                from: "-".into(),
                to: "+".into(),
                only: None
            }
        );
        let r = parse_redrive_args(&args(&[
            "--count",
            "10",
            "--from",
            "1-0",
            "--to",
            "1700000000000",
            "--only",
            "timeout, 500,Crash,0",
        ]))
        .unwrap();
        assert_eq!(r.count, Some(10));
        assert_eq!((r.from.as_str(), r.to.as_str()), ("1-0", "1700000000000"));
        assert_eq!(
            r.only,
            Some(Only {
                classes: vec!["timeout".into(), "crash".into()],
                statuses: vec![500, 0]
            })
        );
        for (bad, reason) in [
            (&["--count"][..], "--count needs a value"),
            (&["--count", "0"], "expected a whole number from 1"),
            (&["--from", "yesterday"], "expected an entry id"),
            (&["--to", "$"], "expected an entry id"),
            (&["--only", "600"], "not a status from 0 to 599"),
            (&["--only", "a b"], "neither a status nor an error class"),
            (&["--only", ""], "neither a status"),
            (&["all"], "unknown argument"),
        ] {
            let e = parse_redrive_args(&args(bad)).unwrap_err();
            assert!(e.contains(reason), "{bad:?}: {e}");
        }
    }

    fn f(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn dead_letters_split_into_their_own_fields_and_ours() {
        let fields = f(&[
            ("order", "1"),
            ("runr-id", "own field, not ours"),
            ("runr-status", "500"),
            ("runr-error", "crash"),
            ("runr-attempts", "5"),
            ("runr-failed-at", "2026-01-01T00:00:00.000Z"),
            ("runr-id", "1-0"),
            ("runr-body", "boom"),
        ]);
        let (own, meta) = split_dead_letter(&fields);
        assert_eq!(
            own,
            &f(&[("order", "1"), ("runr-id", "own field, not ours")])[..]
        );
        assert_eq!(meta.len(), 6);
        let only = |v: &str| parse_only(v).unwrap();
        assert!(only("crash").matches(meta));
        assert!(only("500").matches(meta));
        assert!(!only("timeout,503").matches(meta));
        // Not written by the consumer: nothing to strip, and no filter matches it.
        let foreign = f(&[("a", "b")]);
        let (own, meta) = split_dead_letter(&foreign);
        assert_eq!((own.len(), meta.len()), (1, 0));
        assert!(!only("crash,0").matches(meta));
        assert_eq!(older("5-0", "4-9"), "4-9");
        assert_eq!(older("5-0", "6-0"), "5-0");
    }
}
