//! The names the RunR platform sets in every function container, whether or not the binary
//! that runs there reads them: the runtime contract's container environment, what a function
//! build bakes into its image, the wrapper's own variables, the MCP and model variables, and
//! what Knative adds. They are not mistakes, so [`crate::env::warn_unknown`] leaves them alone;
//! only a name that is neither read by the binary nor on this list gets a warning.
//!
//! A `*` in a name stands for one or more characters (`RUNR_MODEL_*_URL` covers
//! `RUNR_MODEL_GPT4_URL`): the platform makes one variable per model alias.

/// One name (or pattern) of [`VARS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlatformVar {
    /// The name, or a pattern with one `*`.
    pub name: &'static str,
    /// What sets it, and what it is.
    pub meaning: &'static str,
}

const fn var(name: &'static str, meaning: &'static str) -> PlatformVar {
    PlatformVar { name, meaning }
}

/// Every name the platform sets in a function container (the README's "platform variables").
pub const VARS: &[PlatformVar] = &[
    // The container environment of every code runtime.
    var("PORT", "the port the function serves on (Knative: 8080)"),
    var("RUNR_TIMEOUT", "the project's timeout, seconds"),
    var(
        "RUNR_TRIGGER",
        "the project's trigger: http, queue or schedule",
    ),
    var(
        "RUNR_MODE",
        "the container's run shape: schedule in a CronJob (built images run once and exit)",
    ),
    var("RUNR_HANDLER", "the runtime's handler (handler.function)"),
    var(
        "RUNR_FILENAME",
        "the project's entry file (handler.filename)",
    ),
    // Runtimes that run through the wrapper (the manifest's run section).
    var(
        "RUNR_WRAPPER_MODE",
        "run.mode: exec, persistent, http or lambda",
    ),
    var("RUNR_COMMAND", "run.command"),
    var("RUNR_INPUT", "run.input: json or raw"),
    var("RUNR_WORKERS", "run.workers"),
    // Hosted MCP servers and agents, and the models a project may call.
    var(
        "RUNR_MCP_*",
        "the MCP gateway of hosted MCP servers and agents (RUNR_MCP_GATEWAY_KEY, ...)",
    ),
    var(
        "RUNR_MODEL_*_URL",
        "the endpoint of one model alias the project may call",
    ),
    // Knative Serving, in every container of a Knative Service's pods.
    var("K_SERVICE", "Knative: the service's name"),
    var("K_CONFIGURATION", "Knative: the configuration's name"),
    var("K_REVISION", "Knative: the revision's name"),
];

/// Whether the platform sets `name` in function containers ([`VARS`]).
pub fn sets(name: &str) -> bool {
    VARS.iter().any(|v| matches(v.name, name))
}

/// `name` against `pattern`, whose one `*` (if any) stands for one or more characters.
fn matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((prefix, suffix)) => {
            name.len() > prefix.len() + suffix.len()
                && name.starts_with(prefix)
                && name.ends_with(suffix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_patterns() {
        for set in [
            "PORT",
            "RUNR_MODE",
            "RUNR_FILENAME",
            "RUNR_HANDLER",
            "RUNR_MCP_GATEWAY_KEY",
            "RUNR_MODEL_GPT4_URL",
            "RUNR_MODEL_A_URL",
            "K_SERVICE",
        ] {
            assert!(sets(set), "{set}");
        }
        for not in [
            "RUNR_MODEL__URL",
            "RUNR_MODEL_URL",
            "RUNR_MODEL_GPT4_KEY",
            "RUNR_MCP_",
            "RUNR_MODES",
            "RUNR_TIMOUT",
            "K_SERVICES",
            "",
        ] {
            assert!(!sets(not), "{not}");
        }
    }

    #[test]
    fn every_pattern_has_at_most_one_star() {
        for v in VARS {
            assert!(v.name.matches('*').count() <= 1, "{}", v.name);
        }
    }
}
