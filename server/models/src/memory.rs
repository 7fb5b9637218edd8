//! How much memory the server may plan into on the host: the container's
//! cgroup limit (v2, then v1), else what `/proc/meminfo` says is available.
//! Everything reads below a root path, so tests run on fixture trees.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where a memory figure came from (the `source` label of
/// `ferrox_plan_memory_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemorySource {
    /// A cgroup v2 `memory.max`.
    CgroupV2,
    /// A cgroup v1 `memory.limit_in_bytes`.
    CgroupV1,
    /// `MemAvailable` in `/proc/meminfo` (no container limit).
    MemInfo,
    /// Free memory the CUDA driver reports.
    Cuda,
}

impl MemorySource {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            MemorySource::CgroupV2 => "cgroup-v2",
            MemorySource::CgroupV1 => "cgroup-v1",
            MemorySource::MemInfo => "meminfo",
            MemorySource::Cuda => "cuda",
        }
    }
}

/// Bytes of memory to plan into, and where the figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Bytes.
    pub bytes: u64,
    /// Their source.
    pub source: MemorySource,
}

impl std::fmt::Display for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes ({})", self.bytes, self.source.as_str())
    }
}

/// v1 reports "no limit" as a huge page-aligned number; anything this large
/// is no limit.
const V1_UNLIMITED: u64 = 1 << 62;

/// The memory this process may use on the host under `root` (`/` in
/// production): the tightest cgroup limit on its path, capped at MemTotal;
/// without one, MemAvailable.
pub fn host_memory(root: &Path) -> Result<DeviceMemory> {
    let meminfo = read(&root.join("proc/meminfo"))?;
    let total = meminfo_bytes(&meminfo, "MemTotal");
    let cgroups = std::fs::read_to_string(root.join("proc/self/cgroup")).unwrap_or_default();
    let limit = cgroup_v2_limit(root, &cgroups)
        .map(|b| (b, MemorySource::CgroupV2))
        .or_else(|| cgroup_v1_limit(root, &cgroups).map(|b| (b, MemorySource::CgroupV1)));
    if let Some((bytes, source)) = limit {
        let bytes = total.map_or(bytes, |t| bytes.min(t));
        return Ok(DeviceMemory { bytes, source });
    }
    let bytes = meminfo_bytes(&meminfo, "MemAvailable").ok_or_else(|| Error::Config(
        "cannot tell the host's memory: /proc/meminfo has no MemAvailable; give --kv-blocks or --kv-cache-memory".into(),
    ))?;
    Ok(DeviceMemory {
        bytes,
        source: MemorySource::MemInfo,
    })
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

/// `key:  N kB` of `/proc/meminfo`, in bytes.
fn meminfo_bytes(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        kb.checked_mul(1024)
    })
}

/// The cgroup path of the v2 hierarchy (`0::/path`) or of v1's memory
/// controller (`N:...memory...:/path`).
fn cgroup_path(cgroups: &str, v2: bool) -> Option<String> {
    cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if v2 {
            id == "0" && controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == "memory")
        };
        hit.then(|| path.trim().to_string())
    })
}

/// `dir` joined with `path` and each of its ancestors up to `dir` itself:
/// the cgroups whose limits bind this process. (Inside a container the
/// path may name the host's hierarchy; the mount root still counts.)
fn ancestors(dir: &Path, path: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Path::new(path.trim_start_matches('/'))
        .ancestors()
        .map(|p| dir.join(p))
        .collect();
    out.dedup();
    out
}

/// The smallest value `parse` finds in `file` along the cgroup path.
fn tightest(dir: &Path, path: &str, file: &str, parse: fn(&str) -> Option<u64>) -> Option<u64> {
    ancestors(dir, path)
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join(file)).ok())
        .filter_map(|text| parse(text.trim()))
        .min()
}

fn cgroup_v2_limit(root: &Path, cgroups: &str) -> Option<u64> {
    let path = cgroup_path(cgroups, true)?;
    tightest(&root.join("sys/fs/cgroup"), &path, "memory.max", |t| {
        t.parse().ok() // "max" is no limit
    })
}

fn cgroup_v1_limit(root: &Path, cgroups: &str) -> Option<u64> {
    let path = cgroup_path(cgroups, false)?;
    tightest(
        &root.join("sys/fs/cgroup/memory"),
        &path,
        "memory.limit_in_bytes",
        |t| t.parse().ok().filter(|&b| b < V1_UNLIMITED),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str =
        "MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n";

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    /// A case: its name, the files under the fake root, the answer expected.
    type Case = (
        &'static str,
        Vec<(&'static str, &'static str)>,
        Option<(u64, MemorySource)>,
    );

    #[test]
    fn reads_the_tightest_limit_or_what_is_available() {
        use MemorySource::*;
        let gib = 1u64 << 30;
        let cases: Vec<Case> = vec![
            (
                "v2 limit in a container (cgroup namespace)",
                vec![
                    ("proc/self/cgroup", "0::/\n"),
                    ("sys/fs/cgroup/memory.max", "2147483648\n"),
                ],
                Some((2 * gib, CgroupV2)),
            ),
            (
                "v2 nested: the parent's limit binds",
                vec![
                    ("proc/self/cgroup", "0::/kubepods/pod1/ctr\n"),
                    ("sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "max\n"),
                    ("sys/fs/cgroup/kubepods/pod1/memory.max", "1073741824\n"),
                    ("sys/fs/cgroup/kubepods/memory.max", "8589934592\n"),
                ],
                Some((gib, CgroupV2)),
            ),
            (
                "v2 unlimited: MemAvailable",
                vec![
                    ("proc/self/cgroup", "0::/user.slice\n"),
                    ("sys/fs/cgroup/user.slice/memory.max", "max\n"),
                ],
                Some((20_000_000 * 1024, MemInfo)),
            ),
            (
                "v1 memory controller",
                vec![
                    (
                        "proc/self/cgroup",
                        "12:cpu,cpuacct:/x\n7:memory:/docker/abc\n",
                    ),
                    (
                        "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
                        "536870912\n",
                    ),
                ],
                Some((512 << 20, CgroupV1)),
            ),
            (
                "v1 host path not mounted: the mount root's limit",
                vec![
                    ("proc/self/cgroup", "7:memory:/kubepods/burstable/pod9\n"),
                    ("sys/fs/cgroup/memory/memory.limit_in_bytes", "3221225472\n"),
                ],
                Some((3 * gib, CgroupV1)),
            ),
            (
                "v1 unlimited",
                vec![
                    ("proc/self/cgroup", "7:memory:/\n"),
                    (
                        "sys/fs/cgroup/memory/memory.limit_in_bytes",
                        "9223372036854771712\n",
                    ),
                ],
                Some((20_000_000 * 1024, MemInfo)),
            ),
            (
                "limit above the machine: capped at MemTotal",
                vec![
                    ("proc/self/cgroup", "0::/\n"),
                    ("sys/fs/cgroup/memory.max", "107374182400\n"),
                ],
                Some((24_000_000 * 1024, CgroupV2)),
            ),
            (
                "no cgroup at all",
                vec![],
                Some((20_000_000 * 1024, MemInfo)),
            ),
        ];
        for (name, files, want) in cases {
            let mut files = files;
            files.push(("proc/meminfo", MEMINFO));
            let dir = tree(&files);
            let got = host_memory(dir.path()).ok().map(|m| (m.bytes, m.source));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn no_meminfo_is_an_error_that_says_what_to_do() {
        let dir = tree(&[("proc/self/cgroup", "0::/\n")]);
        assert!(host_memory(dir.path()).is_err());
        let dir = tree(&[("proc/meminfo", "MemTotal: 100 kB\n")]);
        let err = host_memory(dir.path()).unwrap_err().to_string();
        assert!(err.contains("--kv-blocks"), "{err}");
    }

    #[test]
    fn this_machine_has_a_figure() {
        let m = host_memory(Path::new("/")).unwrap();
        assert!(m.bytes > 64 << 20, "{m}");
    }
}
