//! The memory the pod gives the wrapper: its cgroup's memory limit, read once at start, and the
//! budget of bytes held for invocations that follows from it (`RUNR_MAX_INFLIGHT_BYTES`).
//!
//! The limit is the smallest one set on the wrapper's own cgroup or an ancestor within the
//! mounted hierarchy: cgroup v2 `memory.max` (`max`: none), else cgroup v1
//! `memory.limit_in_bytes` (the kernel's "unlimited" is a huge page-rounded number). The cgroup
//! comes from `/proc/self/cgroup`, and where its hierarchy is mounted from
//! `/proc/self/mountinfo`, so it is found with and without a cgroup namespace, on hybrid hosts
//! (v2 at `/sys/fs/cgroup/unified`) as well.

use std::path::{Path, PathBuf};

use runr_base::env::{parse_size, Env};

/// Bytes held for invocations at most (buffered bodies, envelopes, collected outputs, replay
/// captures): a size, or `unlimited`. Default: half the cgroup's memory limit; unlimited when
/// there is none.
pub const ENV_MAX_INFLIGHT_BYTES: &str = "RUNR_MAX_INFLIGHT_BYTES";

/// A budget below one request limit could take no request with a body at all.
const MIN_BUDGET: u64 = 1 << 20;

/// v1 reports "no limit" as `PAGE_COUNTER_MAX` pages (9223372036854771712 with 4 KiB pages);
/// anything this large is no limit.
const V1_UNLIMITED: u64 = 1 << 62;

/// The memory limit found and the budget chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryConfig {
    /// The cgroup's limit in bytes, `None` when there is none.
    pub limit: Option<u64>,
    /// Bytes held for invocations at most; `None`: unlimited.
    pub budget: Option<u64>,
    /// Where the budget came from, for the start line.
    pub source: BudgetSource,
}

/// Where the budget came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetSource {
    /// `RUNR_MAX_INFLIGHT_BYTES`.
    Variable,
    /// Half the cgroup limit (or none without one).
    Limit,
}

impl MemoryConfig {
    /// Reads `RUNR_MAX_INFLIGHT_BYTES`, with `limit` (the cgroup's) for the default.
    pub fn parse(env: &mut Env<'_>, limit: Option<u64>) -> MemoryConfig {
        let set = env.optional(ENV_MAX_INFLIGHT_BYTES, |v| {
            if v.eq_ignore_ascii_case("unlimited") {
                return Ok(None);
            }
            match parse_size(v)? {
                n if n >= MIN_BUDGET => Ok(Some(n)),
                _ => Err(format!(
                    "expected unlimited or a size of at least {MIN_BUDGET} bytes (1MiB)"
                )),
            }
        });
        match set {
            Some(budget) => MemoryConfig {
                limit,
                budget,
                source: BudgetSource::Variable,
            },
            None => MemoryConfig {
                limit,
                budget: limit.map(|l| (l / 2).max(MIN_BUDGET)),
                source: BudgetSource::Limit,
            },
        }
    }
}

/// The memory limit of this process's cgroup, `None` when none is set or none can be read.
pub fn cgroup_limit() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    limit_in(&cgroups, &mounts, &|p: &Path| {
        std::fs::read_to_string(p).ok()
    })
}

/// [`cgroup_limit`] over the texts of `/proc/self/cgroup` and `/proc/self/mountinfo`, reading
/// the control files through `read`. v2 first; v1's memory controller when v2 has no memory
/// controller (a hybrid host) or sets nothing.
pub fn limit_in(
    cgroups: &str,
    mounts: &str,
    read: &dyn Fn(&Path) -> Option<String>,
) -> Option<u64> {
    let own = parse_cgroups(cgroups);
    let mounts = parse_mounts(mounts);
    let v2 = own.v2.as_deref().and_then(|path| {
        let mount = mounts.iter().find(|m| m.v2)?;
        smallest(mount, path, "memory.max", read, parse_v2)
    });
    v2.or_else(|| {
        let path = own.v1_memory.as_deref()?;
        let mount = mounts.iter().find(|m| m.v1_memory)?;
        smallest(mount, path, "memory.limit_in_bytes", read, parse_v1)
    })
}

/// A `memory.max`: bytes, or `max` for none.
pub fn parse_v2(text: &str) -> Option<u64> {
    match text.trim() {
        "max" => None,
        n => n.parse().ok(),
    }
}

/// A `memory.limit_in_bytes`: bytes, the kernel's near-`i64::MAX` value for none.
pub fn parse_v1(text: &str) -> Option<u64> {
    text.trim().parse().ok().filter(|n| *n < V1_UNLIMITED)
}

/// This process's cgroup paths: the v2 one (`0::/path`) and v1's memory controller's.
#[derive(Debug, Default, PartialEq, Eq)]
struct OwnCgroups {
    v2: Option<String>,
    v1_memory: Option<String>,
}

fn parse_cgroups(text: &str) -> OwnCgroups {
    let mut own = OwnCgroups::default();
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            own.v2 = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            own.v1_memory = Some(path.to_string());
        }
    }
    own
}

/// One cgroup mount: the hierarchy's directory it shows (`root`) and where.
#[derive(Debug, PartialEq, Eq)]
struct Mount {
    root: String,
    point: PathBuf,
    v2: bool,
    v1_memory: bool,
}

fn parse_mounts(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            // id parent major:minor root point options [optional fields] - type source super
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            let (root, point) = (*left.get(3)?, *left.get(4)?);
            let fstype = *right.first()?;
            let options = right.get(2).copied().unwrap_or("");
            let v2 = fstype == "cgroup2";
            let v1_memory = fstype == "cgroup" && options.split(',').any(|o| o == "memory");
            (v2 || v1_memory).then(|| Mount {
                root: unescape(root),
                point: PathBuf::from(unescape(point)),
                v2,
                v1_memory,
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let n = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(n);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The smallest limit set on `path` or an ancestor visible under `mount`. With a cgroup
/// namespace the process's path is relative to the mount's root already (`/`); without one the
/// mount's root is a prefix of it.
fn smallest(
    mount: &Mount,
    path: &str,
    file: &str,
    read: &dyn Fn(&Path) -> Option<String>,
    parse: fn(&str) -> Option<u64>,
) -> Option<u64> {
    let relative = match path.strip_prefix(mount.root.as_str()) {
        Some(rest) if mount.root != "/" => rest,
        _ => path,
    };
    let mut dir = mount.point.clone();
    let mut limits = Vec::new();
    let mut add = |dir: &Path| {
        if let Some(limit) = read(&dir.join(file)).as_deref().and_then(parse) {
            limits.push(limit);
        }
    };
    add(&dir);
    for part in relative.split('/').filter(|p| !p.is_empty()) {
        dir.push(part);
        add(&dir);
    }
    limits.into_iter().min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const MOUNTS_V2: &str = "\
24 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
25 1 0:5 / /proc rw,nosuid - proc proc rw";

    const MOUNTS_HYBRID: &str = "\
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
34 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let map: HashMap<PathBuf, String> = entries
            .iter()
            .map(|(p, v)| (PathBuf::from(p), v.to_string()))
            .collect();
        move |p: &Path| map.get(p).cloned()
    }

    #[test]
    fn v2_limit_of_the_own_cgroup() {
        let read = files(&[
            ("/sys/fs/cgroup/kubepods/pod1/c1/memory.max", "268435456\n"),
            ("/sys/fs/cgroup/memory.max", "max\n"),
        ]);
        let limit = limit_in("0::/kubepods/pod1/c1\n", MOUNTS_V2, &read);
        assert_eq!(limit, Some(256 << 20));
    }

    #[test]
    fn the_smallest_limit_of_the_path_wins_and_max_is_none() {
        // The pod's limit is on an ancestor; the container's own says max.
        let read = files(&[
            ("/sys/fs/cgroup/kubepods/memory.max", "8589934592"),
            ("/sys/fs/cgroup/kubepods/pod1/memory.max", "536870912"),
            ("/sys/fs/cgroup/kubepods/pod1/c1/memory.max", "max"),
        ]);
        let limit = limit_in("0::/kubepods/pod1/c1\n", MOUNTS_V2, &read);
        assert_eq!(limit, Some(512 << 20));
        let none = files(&[("/sys/fs/cgroup/a/memory.max", "max")]);
        assert_eq!(limit_in("0::/a\n", MOUNTS_V2, &none), None);
    }

    #[test]
    fn a_namespaced_cgroup_is_the_mount_root() {
        // With a cgroup namespace the process sees itself at `/` and its limit at the mount.
        let read = files(&[("/sys/fs/cgroup/memory.max", "1073741824")]);
        assert_eq!(limit_in("0::/\n", MOUNTS_V2, &read), Some(1 << 30));
    }

    #[test]
    fn a_mount_of_a_subtree_is_not_walked_twice() {
        // A container that sees the host's hierarchy from /kubepods/pod1 down.
        let mounts = "30 1 0:22 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw";
        let read = files(&[
            ("/sys/fs/cgroup/memory.max", "max"),
            ("/sys/fs/cgroup/c1/memory.max", "134217728"),
        ]);
        assert_eq!(
            limit_in("0::/kubepods/pod1/c1\n", mounts, &read),
            Some(128 << 20)
        );
    }

    #[test]
    fn v1_memory_controller_and_its_unlimited_value() {
        let cgroups = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/\n";
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes",
                "268435456\n",
            ),
        ]);
        assert_eq!(limit_in(cgroups, MOUNTS_HYBRID, &read), Some(256 << 20));
        let unlimited = files(&[(
            "/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes",
            "9223372036854771712\n",
        )]);
        assert_eq!(limit_in(cgroups, MOUNTS_HYBRID, &unlimited), None);
    }

    #[test]
    fn nothing_readable_is_no_limit() {
        let read = files(&[]);
        assert_eq!(limit_in("0::/a\n", MOUNTS_V2, &read), None);
        assert_eq!(limit_in("", "", &read), None);
        assert_eq!(parse_v2("garbage"), None);
        assert_eq!(parse_v2(" 4096\n"), Some(4096));
        assert_eq!(parse_v1("-1"), None);
    }

    #[test]
    fn escaped_mount_points() {
        let mounts = r"30 1 0:22 / /mnt/my\040cgroup rw - cgroup2 cgroup2 rw";
        let read = files(&[("/mnt/my cgroup/a/memory.max", "1048576")]);
        assert_eq!(limit_in("0::/a\n", mounts, &read), Some(1 << 20));
    }

    fn parse(value: Option<&str>, limit: Option<u64>) -> Result<MemoryConfig, Vec<&'static str>> {
        let get = |name: &str| {
            (name == ENV_MAX_INFLIGHT_BYTES)
                .then(|| value.map(str::to_string))
                .flatten()
        };
        let mut env = Env::new(&get);
        let c = MemoryConfig::parse(&mut env, limit);
        env.finish().map(|()| c).map_err(|e| e.names())
    }

    #[test]
    fn the_budget_is_half_the_limit_or_the_variable() {
        let c = parse(None, Some(256 << 20)).unwrap();
        assert_eq!((c.limit, c.budget), (Some(256 << 20), Some(128 << 20)));
        assert_eq!(parse(None, None).unwrap().budget, None);
        let c = parse(Some("64MiB"), Some(256 << 20)).unwrap();
        assert_eq!(
            (c.budget, c.source),
            (Some(64 << 20), BudgetSource::Variable)
        );
        assert_eq!(
            parse(Some("unlimited"), Some(256 << 20)).unwrap().budget,
            None
        );
        assert_eq!(parse(Some("1KiB"), None), Err(vec![ENV_MAX_INFLIGHT_BYTES]));
        assert_eq!(parse(Some("lots"), None), Err(vec![ENV_MAX_INFLIGHT_BYTES]));
    }
}
