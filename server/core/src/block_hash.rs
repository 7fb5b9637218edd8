//! Prefix-cache identities of full KV blocks. A block's hash chains its
//! parent block's hash and its own token ids, from a root that names
//! everything else the KV depends on (the model, the KV dtype), so two blocks
//! with the same hash hold the same KV: same tokens after the same prefix,
//! computed by the same model into the same dtype.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// The identity of one full block and of everything before it; written as
/// 64 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash([u8; 32]);

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl FromStr for BlockHash {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return Err(format!(
                "a block hash is 64 hex digits, not {}",
                bytes.len()
            ));
        }
        let digit = |c: u8| (c as char).to_digit(16).ok_or("not a hex digit");
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
        }
        Ok(BlockHash(out))
    }
}

impl Serialize for BlockHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for BlockHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl BlockHash {
    /// Its 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// Hashes full blocks of token ids into chains. Cheap to clone.
///
/// SHA-256 rather than a fast 64-bit hash: a block found by hash is read by
/// another request without a look at its tokens, so a collision a client
/// could construct would let it read or poison another client's KV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockHasher {
    root: BlockHash,
    block_size: usize,
}

impl BlockHasher {
    /// A hasher for blocks of `block_size` tokens (at least 1), whose chains
    /// start from `salt`: whatever else decides what the KV holds.
    pub fn new(salt: &str, block_size: usize) -> Self {
        let mut h = Sha256::new();
        h.update(b"ferrox prefix cache v1\0");
        h.update(salt.as_bytes());
        BlockHasher {
            root: BlockHash(h.finalize().into()),
            block_size: block_size.max(1),
        }
    }

    /// The hasher of one tenant's chains (vLLM's `cache_salt`): its root
    /// mixes `salt` in, so a salted request's blocks never share a hash
    /// with another salt's or with unsalted ones (no probing another
    /// tenant's prompts through time to first token).
    pub fn salted(&self, salt: &str) -> Self {
        let mut h = Sha256::new();
        h.update(b"cache_salt\0");
        h.update(self.root.0);
        h.update(salt.as_bytes());
        BlockHasher {
            root: BlockHash(h.finalize().into()),
            block_size: self.block_size,
        }
    }

    /// The hasher of one LoRA adapter's chains: the same tokens through
    /// another adapter make other KV, so its root mixes the adapter's `key`
    /// in (a domain of its own, apart from `cache_salt`'s).
    pub fn adapter(&self, key: &str) -> Self {
        let mut h = Sha256::new();
        h.update(b"lora_adapter\0");
        h.update(self.root.0);
        h.update(key.as_bytes());
        BlockHasher {
            root: BlockHash(h.finalize().into()),
            block_size: self.block_size,
        }
    }

    /// The hasher of one request: the adapter's chains (if it names one),
    /// then salted by its `cache_salt`. The server and a router both hash
    /// through this, so they agree.
    pub fn for_request(&self, adapter_key: Option<&str>, cache_salt: Option<&str>) -> Self {
        let base = match adapter_key {
            Some(key) => self.adapter(key),
            None => self.clone(),
        };
        match cache_salt {
            Some(salt) => base.salted(salt),
            None => base,
        }
    }

    /// A hasher whose chains start from `root` (another process's
    /// [`BlockHasher::root`]): a router hashes as the server does without
    /// knowing what the server's salt names.
    pub fn from_root(root: BlockHash, block_size: usize) -> Self {
        BlockHasher {
            root,
            block_size: block_size.max(1),
        }
    }

    /// The root every chain of this hasher starts from.
    pub fn root(&self) -> BlockHash {
        self.root
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The hash of a block holding `tokens` whose parent block hashed to
    /// `parent` (`None` for a sequence's first block).
    pub fn next(
        &self,
        parent: Option<&BlockHash>,
        tokens: impl IntoIterator<Item = u32>,
    ) -> BlockHash {
        let mut h = Sha256::new();
        h.update(parent.unwrap_or(&self.root).0);
        for t in tokens {
            h.update(t.to_le_bytes());
        }
        BlockHash(h.finalize().into())
    }

    /// Extends `chain` (the hashes of the first `chain.len()` blocks of
    /// `tokens`) with the hash of every further full block of `tokens`.
    pub fn extend(&self, chain: &mut Vec<BlockHash>, tokens: impl Fn(usize) -> u32, len: usize) {
        let bs = self.block_size;
        while (chain.len() + 1) * bs <= len {
            let start = chain.len() * bs;
            let next = self.next(chain.last(), (start..start + bs).map(&tokens));
            chain.push(next);
        }
    }

    /// The hashes of every full block of `tokens`.
    pub fn chain(&self, tokens: &[u32]) -> Vec<BlockHash> {
        let mut chain = Vec::with_capacity(tokens.len() / self.block_size);
        self.extend(&mut chain, |i| tokens[i], tokens.len());
        chain
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salts_part_chains_from_the_first_block() {
        let h = BlockHasher::new("m", 2);
        let tokens = [1, 2, 3, 4];
        let plain = h.chain(&tokens);
        let (a, b) = (h.salted("a"), h.salted("b"));
        assert_eq!(a.chain(&tokens), h.salted("a").chain(&tokens));
        for (x, y) in [
            (&plain, &a.chain(&tokens)),
            (&a.chain(&tokens), &b.chain(&tokens)),
        ] {
            assert!(x.iter().zip(y).all(|(p, q)| p != q), "{x:?} {y:?}");
        }
        assert_eq!(a.block_size(), 2);
    }

    #[test]
    fn adapters_part_chains_from_each_other_from_the_base_and_from_salts() {
        let h = BlockHasher::new("m", 2);
        let tokens = [1, 2, 3, 4];
        let chains = [
            h.for_request(None, None).chain(&tokens),
            h.for_request(Some("a@1"), None).chain(&tokens),
            h.for_request(Some("b@1"), None).chain(&tokens),
            h.for_request(None, Some("a@1")).chain(&tokens),
            h.for_request(Some("a@1"), Some("t")).chain(&tokens),
        ];
        for (i, x) in chains.iter().enumerate() {
            for y in &chains[i + 1..] {
                assert!(x.iter().zip(y).all(|(p, q)| p != q), "{x:?} {y:?}");
            }
        }
        assert_eq!(chains[0], h.chain(&tokens));
        assert_eq!(chains[1], h.adapter("a@1").chain(&tokens));
        assert_eq!(chains[4], h.adapter("a@1").salted("t").chain(&tokens));
    }

    #[test]
    fn equal_hashes_mean_equal_tokens_after_an_equal_prefix() {
        let h = BlockHasher::new("model-a/f16", 2);
        let a = h.chain(&[1, 2, 3, 4, 5]);
        assert_eq!(a.len(), 2, "only full blocks are hashed");
        // Same first block, different second: shares exactly one.
        let b = h.chain(&[1, 2, 3, 9]);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        // The same block tokens after a different prefix do not match.
        let c = h.chain(&[7, 7, 3, 4]);
        assert_ne!(a[1], c[1]);
        // Another model or KV dtype never matches.
        let other = BlockHasher::new("model-a/f32", 2);
        assert_ne!(other.chain(&[1, 2])[0], a[0]);
        // Token boundaries count: [1, 2] is not [0x201] nor a reordering.
        assert_ne!(h.chain(&[2, 1])[0], a[0]);
    }

    #[test]
    fn extending_a_chain_equals_hashing_the_whole() {
        let h = BlockHasher::new("s", 3);
        let tokens: Vec<u32> = (0..20).collect();
        let mut chain = h.chain(&tokens[..7]);
        assert_eq!(chain.len(), 2);
        h.extend(&mut chain, |i| tokens[i], 10);
        assert_eq!(chain.len(), 3);
        h.extend(&mut chain, |i| tokens[i], tokens.len());
        assert_eq!(chain, h.chain(&tokens));
        assert_eq!(BlockHasher::new("s", 0).block_size(), 1);
    }

    #[test]
    fn a_hasher_rebuilt_from_its_root_chains_alike_and_hashes_read_back() {
        let h = BlockHasher::new("model|kv=f16", 4).salted("tenant");
        let again = BlockHasher::from_root(h.root().to_string().parse().unwrap(), 4);
        let tokens: Vec<u32> = (0..13).collect();
        assert_eq!(again.chain(&tokens), h.chain(&tokens));
        let x = h.chain(&tokens)[0];
        assert_eq!(x.to_string().parse::<BlockHash>(), Ok(x));
        for bad in ["", "0g", &"f".repeat(63), &"g".repeat(64)] {
            assert!(bad.parse::<BlockHash>().is_err(), "{bad}");
        }
    }
}
