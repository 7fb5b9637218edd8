//! Consistent hashing with bounded load (CHWBL, Mirrokni et al.; as KubeAI
//! routes): the fallback when a model's tokenizer is not known. The key is the
//! prompt's leading characters, so prompts that share an opening go to the
//! same endpoint while it has room; an endpoint over `load_factor` times the
//! mean load passes its keys on, clockwise.

/// Virtual nodes per endpoint: enough that keys spread within a few percent.
const VNODES: u32 = 64;

/// How many leading characters of the prompt make the key.
pub const KEY_CHARS: usize = 256;

/// KubeAI's default: an endpoint may carry 25% over the mean.
pub const DEFAULT_LOAD_FACTOR: f64 = 1.25;

/// FNV-1a, then a 64-bit finaliser: stable across processes and versions
/// (two routers must agree), well spread on a ring.
fn hash64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // A separator, so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The key of a prompt: its first [`KEY_CHARS`] characters.
pub fn prompt_key(text: &str) -> &str {
    match text.char_indices().nth(KEY_CHARS) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// The endpoint (an index into `names`) for `key`: the first clockwise from
/// the key's hash whose in-flight count plus this request stays within
/// `ceil(load_factor * (total + 1) / n)`. `None` only when `names` is empty.
/// `names` and `in_flight` are parallel.
pub fn pick(names: &[&str], in_flight: &[usize], key: &str, load_factor: f64) -> Option<usize> {
    let n = names.len().min(in_flight.len());
    if n == 0 {
        return None;
    }
    let total: usize = in_flight[..n].iter().sum();
    let factor = if load_factor.is_finite() {
        load_factor.max(1.0)
    } else {
        DEFAULT_LOAD_FACTOR
    };
    // At least the mean, so some endpoint always has room.
    let bound = ((total + 1) as f64 * factor / n as f64).ceil() as usize;
    let mut ring: Vec<(u64, usize)> = (0..n)
        .flat_map(|i| {
            (0..VNODES).map(move |v| (hash64(&[names[i].as_bytes(), &v.to_le_bytes()]), i))
        })
        .collect();
    ring.sort_unstable();
    let at = hash64(&[key.as_bytes()]);
    let start = ring.partition_point(|&(h, _)| h < at);
    (0..ring.len())
        .map(|k| ring[(start + k) % ring.len()].1)
        .find(|&i| in_flight[i] < bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: [&str; 3] = ["a", "b", "c"];

    #[test]
    fn one_key_one_endpoint_while_loads_are_even() {
        let idle = [0, 0, 0];
        let first = pick(&NAMES, &idle, "You are a helpful", 1.25).unwrap();
        for _ in 0..3 {
            assert_eq!(pick(&NAMES, &idle, "You are a helpful", 1.25), Some(first));
        }
        // Keys spread: 300 keys reach every endpoint, none takes most.
        let mut counts = [0usize; 3];
        for k in 0..300 {
            counts[pick(&NAMES, &idle, &format!("prompt {k}"), 1.25).unwrap()] += 1;
        }
        assert!(
            counts.iter().all(|&c| (40..=180).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn a_loaded_endpoint_passes_its_keys_on_and_the_order_is_by_name() {
        let key = "shared system prompt";
        let home = pick(&NAMES, &[0, 0, 0], key, 1.25).unwrap();
        // total 4 +1 over 3 at 1.25: bound ceil(2.08) = 3; home at 4 is over.
        let mut loads = [0, 0, 0];
        loads[home] = 4;
        let moved = pick(&NAMES, &loads, key, 1.25).unwrap();
        assert_ne!(moved, home);
        // The same endpoint set in another order picks the same name.
        let rev: Vec<&str> = NAMES.iter().rev().copied().collect();
        let i = pick(&rev, &[0, 0, 0], key, 1.25).unwrap();
        assert_eq!(rev[i], NAMES[home]);
        // Leaving: the other keys of the remaining endpoints stay put.
        let stay: Vec<&str> = NAMES.iter().copied().filter(|&n| n != "c").collect();
        for k in 0..50 {
            let key = format!("k{k}");
            let before = NAMES[pick(&NAMES, &[0, 0, 0], &key, 1.25).unwrap()];
            let after = stay[pick(&stay, &[0, 0], &key, 1.25).unwrap()];
            if before != "c" {
                assert_eq!(before, after, "{key}");
            }
        }
    }

    #[test]
    fn edges() {
        assert_eq!(pick(&[], &[], "k", 1.25), None);
        assert_eq!(pick(&["x"], &[100], "k", f64::NAN), Some(0));
        let long = "é".repeat(KEY_CHARS + 10);
        assert_eq!(prompt_key(&long).chars().count(), KEY_CHARS);
        assert_eq!(prompt_key("short"), "short");
        assert_ne!(hash64(&[b"ab", b"c"]), hash64(&[b"a", b"bc"]));
    }
}
