//! The variables of lambda mode (`RUNR_WRAPPER_MODE=lambda`): what the runtime processes are
//! told about the function (handler, name, version, region), whether the emulator's invoke API
//! is served, and which program is the runtime when `RUNR_COMMAND` is not set.

use std::path::{Path, PathBuf};

use runr_base::env::{Env, VarDoc};

use super::ENV_COMMAND;

/// The handler name the runtime gets as `_HANDLER` (`app.handler` for Python's awslambdaric,
/// anything a custom runtime reads). Unset: `_HANDLER` is left as the container has it.
pub const ENV_HANDLER: &str = "RUNR_HANDLER";

/// The region the runtime gets as `AWS_REGION`/`AWS_DEFAULT_REGION`, also in the function ARN
/// and in the events.
pub const ENV_REGION: &str = "RUNR_REGION";
const DEFAULT_REGION: &str = "runr";

/// `1`: also serve the emulator's `POST /2015-03-31/functions/function/invocations` on `$PORT`
/// (the body is the event, the result is the answer). Off by default: it lets any caller craft
/// any event.
pub const ENV_INVOKE_API: &str = "RUNR_LAMBDA_INVOKE_API";

/// Set by Knative: the function's name (`AWS_LAMBDA_FUNCTION_NAME`).
pub const ENV_K_SERVICE: &str = "K_SERVICE";
const DEFAULT_FUNCTION_NAME: &str = "function";

/// Set by Knative: the revision (`AWS_LAMBDA_FUNCTION_VERSION`).
pub const ENV_K_REVISION: &str = "K_REVISION";
const DEFAULT_FUNCTION_VERSION: &str = "$LATEST";

/// The runtime's time zone: passed on when set, `:UTC` otherwise (as Lambda runs).
pub const ENV_TZ: &str = "TZ";
/// `TZ` of the runtime processes when the container sets none.
pub const DEFAULT_TZ: &str = ":UTC";

/// Where a function's code lives when it is mounted (`LAMBDA_TASK_ROOT` when it exists).
const CODE_DIR: &str = "/app/code";

/// Where the runtime is looked for, in order, when `RUNR_COMMAND` is not set (the task root's
/// own `bootstrap` first, as Lambda does for custom runtimes).
const BOOTSTRAP_DIRS: [&str; 2] = ["/opt", "/var/runtime"];

/// The variables of lambda mode, for `version`/`help`.
pub const VARS: &[VarDoc] = &[
    VarDoc::optional(
        ENV_HANDLER,
        "lambda mode: the handler name, given to the runtime as _HANDLER",
    ),
    VarDoc::new(
        ENV_REGION,
        DEFAULT_REGION,
        "lambda mode: AWS_REGION of the runtime, in ARNs and events",
    ),
    VarDoc::new(
        ENV_INVOKE_API,
        "0",
        "lambda mode: 1 serves the emulator's POST /2015-03-31/functions/function/invocations",
    ),
    VarDoc::new(
        ENV_K_SERVICE,
        DEFAULT_FUNCTION_NAME,
        "lambda mode (set by Knative): AWS_LAMBDA_FUNCTION_NAME",
    ),
    VarDoc::new(
        ENV_K_REVISION,
        DEFAULT_FUNCTION_VERSION,
        "lambda mode (set by Knative): AWS_LAMBDA_FUNCTION_VERSION",
    ),
    VarDoc::new(
        ENV_TZ,
        DEFAULT_TZ,
        "lambda mode: the runtime's TZ, :UTC unless the container sets one",
    ),
];

/// Everything lambda mode reads besides the common variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LambdaConfig {
    /// `RUNR_HANDLER`.
    pub handler: Option<String>,
    /// `RUNR_REGION`.
    pub region: String,
    /// `K_SERVICE`, else `function`.
    pub function_name: String,
    /// `K_REVISION`, else `$LATEST`.
    pub function_version: String,
    /// `RUNR_LAMBDA_INVOKE_API`.
    pub invoke_api: bool,
    /// `TZ` as set; `None` means the runtime gets [`DEFAULT_TZ`].
    pub tz: Option<String>,
    /// `LAMBDA_TASK_ROOT`: `/app/code` when it is a directory, else the working directory; the
    /// runtime's working directory too.
    pub task_root: PathBuf,
}

impl LambdaConfig {
    /// Reads lambda mode's variables into `env` (errors are collected there).
    pub fn parse(env: &mut Env<'_>) -> LambdaConfig {
        let handler = env.optional(ENV_HANDLER, |v| printable(v, 1024).map(str::to_string));
        let region = env.parse(ENV_REGION, DEFAULT_REGION.to_string(), parse_region);
        let function_name = env.parse(ENV_K_SERVICE, DEFAULT_FUNCTION_NAME.to_string(), |v| {
            printable(v, 140).map(str::to_string)
        });
        let function_version =
            env.parse(ENV_K_REVISION, DEFAULT_FUNCTION_VERSION.to_string(), |v| {
                printable(v, 140).map(str::to_string)
            });
        let invoke_api = env.flag(ENV_INVOKE_API, false);
        let tz = env.value(ENV_TZ);
        let code = Path::new(CODE_DIR);
        let task_root = if code.is_dir() {
            code.to_path_buf()
        } else {
            std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"))
        };
        LambdaConfig {
            handler,
            region,
            function_name,
            function_version,
            invoke_api,
            tz,
            task_root,
        }
    }

    /// The runtime program: `RUNR_COMMAND` when set, else the first executable of
    /// `$LAMBDA_TASK_ROOT/bootstrap`, `/opt/bootstrap`, `/var/runtime/bootstrap` (an error
    /// naming `RUNR_COMMAND` when there is none).
    pub fn command(&self, env: &mut Env<'_>) -> Option<Vec<String>> {
        if env.value(ENV_COMMAND).is_some() {
            return env.optional(ENV_COMMAND, super::parse_command);
        }
        let candidates = bootstrap_candidates(&self.task_root);
        match candidates.iter().find(|p| is_executable(p)) {
            Some(found) => Some(vec![found.to_string_lossy().into_owned()]),
            None => {
                let list: Vec<String> =
                    candidates.iter().map(|p| p.display().to_string()).collect();
                env.reject(
                    ENV_COMMAND,
                    None,
                    format!(
                        "required in lambda mode unless one of {} is an executable",
                        list.join(", ")
                    ),
                );
                None
            }
        }
    }

    /// `arn:aws:lambda:<region>:000000000000:function:<name>`, the invoked function's ARN.
    pub fn function_arn(&self) -> String {
        format!(
            "arn:aws:lambda:{}:000000000000:function:{}",
            self.region, self.function_name
        )
    }
}

/// Where the bootstrap is looked for, in order.
fn bootstrap_candidates(task_root: &Path) -> Vec<PathBuf> {
    let mut out = vec![task_root.join("bootstrap")];
    out.extend(
        BOOTSTRAP_DIRS
            .iter()
            .map(|d| Path::new(d).join("bootstrap")),
    );
    out
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Visible ASCII (no spaces or controls), at most `max` bytes: these values travel in headers
/// and ARNs.
fn printable(v: &str, max: usize) -> Result<&str, String> {
    if v.len() > max {
        return Err(format!("longer than {max} characters"));
    }
    if !v.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("expected visible ASCII characters without spaces".into());
    }
    Ok(v)
}

/// `eu-west-1`, `runr`: letters, digits and `-`.
fn parse_region(v: &str) -> Result<String, String> {
    let ok = v.len() <= 64 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(v.to_string())
    } else {
        Err("expected letters, digits and '-' (e.g. eu-west-1), at most 64".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> (LambdaConfig, Option<Vec<String>>, Vec<String>) {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |name: &str| map.get(name).cloned();
        let mut env = Env::new(&get);
        let config = LambdaConfig::parse(&mut env);
        let command = config.command(&mut env);
        let errors = match env.finish() {
            Ok(()) => Vec::new(),
            Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
        };
        (config, command, errors)
    }

    #[test]
    fn defaults() {
        let (c, command, errors) = parse(&[(ENV_COMMAND, "/bin/bootstrap")]);
        assert_eq!(errors, Vec::<String>::new());
        assert_eq!(command.unwrap(), ["/bin/bootstrap"]);
        assert_eq!(c.handler, None);
        assert_eq!(c.region, "runr");
        assert_eq!(c.function_name, "function");
        assert_eq!(c.function_version, "$LATEST");
        assert!(!c.invoke_api);
        assert_eq!(c.tz, None);
        assert_eq!(
            c.function_arn(),
            "arn:aws:lambda:runr:000000000000:function:function"
        );
    }

    #[test]
    fn every_variable() {
        let (c, _, errors) = parse(&[
            (ENV_COMMAND, "python3 -m awslambdaric"),
            (ENV_HANDLER, "app.handler"),
            (ENV_REGION, "eu-west-1"),
            (ENV_K_SERVICE, "orders-api"),
            (ENV_K_REVISION, "orders-api-00003"),
            (ENV_INVOKE_API, "1"),
            (ENV_TZ, "Europe/Berlin"),
        ]);
        assert_eq!(errors, Vec::<String>::new());
        assert_eq!(c.handler.as_deref(), Some("app.handler"));
        assert_eq!(c.region, "eu-west-1");
        assert_eq!(c.function_name, "orders-api");
        assert_eq!(c.function_version, "orders-api-00003");
        assert!(c.invoke_api);
        assert_eq!(c.tz.as_deref(), Some("Europe/Berlin"));
        assert_eq!(
            c.function_arn(),
            "arn:aws:lambda:eu-west-1:000000000000:function:orders-api"
        );
    }

    #[test]
    fn bad_values_name_their_variable() {
        let (_, _, errors) = parse(&[
            (ENV_COMMAND, "x"),
            (ENV_REGION, "eu west"),
            (ENV_K_SERVICE, "a\u{7f}b"),
            (ENV_INVOKE_API, "maybe"),
            (ENV_HANDLER, "app handler"),
        ]);
        let names: Vec<&str> = errors
            .iter()
            .map(|e| e.split('=').next().unwrap())
            .collect();
        assert_eq!(
            names,
            [ENV_HANDLER, ENV_REGION, ENV_K_SERVICE, ENV_INVOKE_API],
            "{errors:?}"
        );
    }

    #[test]
    fn the_bootstrap_is_found_in_the_task_root_first() {
        let dir = tempfile::tempdir().unwrap();
        let candidates = bootstrap_candidates(dir.path());
        assert_eq!(candidates[0], dir.path().join("bootstrap"));
        assert_eq!(
            candidates[1..],
            [
                PathBuf::from("/opt/bootstrap"),
                PathBuf::from("/var/runtime/bootstrap")
            ]
        );
        let boot = dir.path().join("bootstrap");
        std::fs::write(&boot, "#!/bin/sh\n").unwrap();
        assert!(!is_executable(&boot), "not executable yet");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&boot, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(is_executable(&boot));
        let config = LambdaConfig {
            task_root: dir.path().to_path_buf(),
            ..parse(&[(ENV_COMMAND, "x")]).0
        };
        let get = |_: &str| None;
        let mut env = Env::new(&get);
        assert_eq!(
            config.command(&mut env).unwrap(),
            [boot.display().to_string()]
        );
    }

    #[test]
    fn no_command_and_no_bootstrap_is_an_error_naming_runr_command() {
        let dir = tempfile::tempdir().unwrap();
        let config = LambdaConfig {
            task_root: dir.path().to_path_buf(),
            ..parse(&[(ENV_COMMAND, "x")]).0
        };
        let get = |_: &str| None;
        let mut env = Env::new(&get);
        if Path::new("/opt/bootstrap").exists() || Path::new("/var/runtime/bootstrap").exists() {
            eprintln!("skipped: this machine has a Lambda bootstrap installed");
            return;
        }
        assert_eq!(config.command(&mut env), None);
        let errors = env.finish().unwrap_err();
        assert_eq!(errors.names(), [ENV_COMMAND]);
        let text = errors.to_string();
        assert!(
            text.contains("RUNR_COMMAND=<unset>: required in lambda mode unless one of"),
            "{text}"
        );
    }
}
