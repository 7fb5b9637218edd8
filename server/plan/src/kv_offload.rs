//! The KV cache's second tier, as the operator, the server and the router
//! name it: where a prefix block evicted from the device pool can live
//! (`host` memory, `disk`), the `--kv-offload` values that ask for them,
//! and the order a router weights hits in.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a cached prefix block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvTier {
    /// The pool the model reads (GPU memory, or host memory on a CPU server).
    Device,
    /// Host memory beside a GPU's pool.
    Host,
    /// Files on a volume; survives a restart and scale to zero.
    Disk,
}

impl KvTier {
    /// The lower tiers, in the order a block falls through them.
    pub const LOWER: [KvTier; 2] = [KvTier::Host, KvTier::Disk];

    /// Its name on every wire (`device`, `host`, `disk`).
    pub fn name(self) -> &'static str {
        match self {
            KvTier::Device => "device",
            KvTier::Host => "host",
            KvTier::Disk => "disk",
        }
    }
}

impl fmt::Display for KvTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvTier {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "device" => Ok(KvTier::Device),
            "host" => Ok(KvTier::Host),
            "disk" => Ok(KvTier::Disk),
            other => Err(format!(
                "`{other}` is not a KV tier; expected device, host or disk"
            )),
        }
    }
}

/// One `--kv-offload` value: a lower tier and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffloadTier {
    /// `host=SIZE`: bytes of host memory.
    Host {
        /// Bytes the tier may hold.
        bytes: u64,
    },
    /// `disk=PATH:SIZE`: a directory and the bytes its files may take.
    Disk {
        /// The directory (created if absent; reused by a later process).
        path: String,
        /// Bytes the tier's files may take.
        bytes: u64,
    },
}

impl OffloadTier {
    /// The tier it is.
    pub fn tier(&self) -> KvTier {
        match self {
            OffloadTier::Host { .. } => KvTier::Host,
            OffloadTier::Disk { .. } => KvTier::Disk,
        }
    }

    /// Bytes the tier may hold.
    pub fn bytes(&self) -> u64 {
        match self {
            OffloadTier::Host { bytes } | OffloadTier::Disk { bytes, .. } => *bytes,
        }
    }

    /// The flag's value (`host=BYTES`, `disk=PATH:BYTES`), read back by
    /// [`OffloadTier::parse`].
    pub fn to_arg(&self) -> String {
        match self {
            OffloadTier::Host { bytes } => format!("host={bytes}"),
            OffloadTier::Disk { path, bytes } => format!("disk={path}:{bytes}"),
        }
    }

    /// Parses `host=SIZE` or `disk=PATH:SIZE`; SIZE is bytes or a
    /// quantity (`512Mi`, `8Gi`, `10G`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let (tier, rest) = text.split_once('=').ok_or_else(|| {
            format!("`{text}` is not host=SIZE or disk=PATH:SIZE (e.g. host=8Gi, disk=/cache:64Gi)")
        })?;
        match tier.trim() {
            "host" => Ok(OffloadTier::Host {
                bytes: parse_size(rest)?,
            }),
            "disk" => {
                let (path, size) = rest.rsplit_once(':').ok_or_else(|| {
                    format!("`{text}`: a disk tier is disk=PATH:SIZE (e.g. disk=/cache:64Gi)")
                })?;
                if path.trim().is_empty() {
                    return Err(format!("`{text}`: the disk tier's path is empty"));
                }
                Ok(OffloadTier::Disk {
                    path: path.trim().to_string(),
                    bytes: parse_size(size)?,
                })
            }
            other => Err(format!(
                "`{other}` in `{text}` is not a lower KV tier; expected host or disk"
            )),
        }
    }
}

/// Bytes from `1048576`, `512Ki`, `512Mi`, `8Gi`, `1Ti`, `10K`, `10M`,
/// `10G`, `1T` (Kubernetes' quantity suffixes); more than zero.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let unit: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "`{t}` is not a size (e.g. 1048576, 512Mi, 8Gi, 10G)"
            ));
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{t}` is not a size (e.g. 1048576, 512Mi, 8Gi, 10G)"))?;
    match n.checked_mul(unit) {
        Some(0) => Err(format!("a tier of `{t}` holds nothing; give it some bytes")),
        Some(b) => Ok(b),
        None => Err(format!("`{t}` is too large")),
    }
}

/// How much a router's score counts a block held in each tier: a device
/// hit skips the prefill outright, a lower one costs a read first.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TierWeights {
    /// A block in the device pool.
    pub device: f64,
    /// A block in host memory.
    pub host: f64,
    /// A block on disk.
    pub disk: f64,
}

impl Default for TierWeights {
    fn default() -> Self {
        // Dynamo's order: a device hit skips the prefill outright, a lower
        // one costs a read first (a disk read more than a host one).
        TierWeights {
            device: 1.0,
            host: 0.8,
            disk: 0.5,
        }
    }
}

impl TierWeights {
    /// The weight of a block held in `tier`.
    pub fn of(&self, tier: KvTier) -> f64 {
        match tier {
            KvTier::Device => self.device,
            KvTier::Host => self.host,
            KvTier::Disk => self.disk,
        }
    }

    /// Parses `device=1,host=0.8,disk=0.5` (any subset; the rest default);
    /// each weight in [0, 1] and no lower tier above a higher one.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut w = TierWeights::default();
        for pair in text.split(',').filter(|p| !p.trim().is_empty()) {
            let (tier, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not TIER=WEIGHT (e.g. host=0.8)"))?;
            let tier: KvTier = tier.parse()?;
            let value: f64 = value
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| (0.0..=1.0).contains(v))
                .ok_or_else(|| format!("`{value}` in `{pair}` is not a weight in [0, 1]"))?;
            match tier {
                KvTier::Device => w.device = value,
                KvTier::Host => w.host = value,
                KvTier::Disk => w.disk = value,
            }
        }
        if w.host > w.device || w.disk > w.host {
            return Err(format!(
                "tier weights must not rise down the tiers (device {} >= host {} >= disk {})",
                w.device, w.host, w.disk
            ));
        }
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offload_values_read_back_and_bad_ones_say_why() {
        let gi = 1u64 << 30;
        for (text, want) in [
            ("host=8Gi", Ok(OffloadTier::Host { bytes: 8 * gi })),
            (
                "disk=/var/cache/kv:64Gi",
                Ok(OffloadTier::Disk {
                    path: "/var/cache/kv".into(),
                    bytes: 64 * gi,
                }),
            ),
            ("host=1048576", Ok(OffloadTier::Host { bytes: 1 << 20 })),
            (
                "host=10G",
                Ok(OffloadTier::Host {
                    bytes: 10_000_000_000,
                }),
            ),
            ("host", Err("is not host=SIZE or disk=PATH:SIZE")),
            ("disk=/x", Err("a disk tier is disk=PATH:SIZE")),
            ("disk=:8Gi", Err("path is empty")),
            ("gpu=8Gi", Err("not a lower KV tier")),
            ("host=8GB", Err("is not a size")),
            ("host=0", Err("holds nothing")),
            ("host=99999999999Ti", Err("too large")),
        ] {
            match (OffloadTier::parse(text), want) {
                (Ok(got), Ok(want)) => {
                    assert_eq!(got, want, "{text}");
                    assert_eq!(OffloadTier::parse(&got.to_arg()).unwrap(), got);
                }
                (Err(e), Err(want)) => assert!(e.contains(want), "{text}: {e}"),
                (got, want) => panic!("{text}: {got:?} vs {want:?}"),
            }
        }
    }

    #[test]
    fn tier_weights_default_fall_down_the_tiers_and_parse() {
        let d = TierWeights::default();
        assert!(d.device > d.host && d.host > d.disk && d.disk > 0.0);
        let w = TierWeights::parse("host=0.6, disk=0.2").unwrap();
        assert_eq!((w.device, w.host, w.disk), (1.0, 0.6, 0.2));
        assert_eq!(w.of(KvTier::Disk), 0.2);
        for (text, want) in [
            ("host=2", "not a weight in [0, 1]"),
            ("disk=0.9", "must not rise down the tiers"),
            ("ssd=0.1", "not a KV tier"),
            ("host", "not TIER=WEIGHT"),
        ] {
            let e = TierWeights::parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        for t in [KvTier::Device, KvTier::Host, KvTier::Disk] {
            assert_eq!(t.name().parse::<KvTier>().unwrap(), t);
        }
    }
}
