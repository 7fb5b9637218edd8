//! API keys: `Authorization: Bearer <key>`, compared in constant time.
//! Keys are kept only as SHA-256 digests, so the comparison takes the same
//! time whatever the key's length or where it differs. The server and the
//! router check keys with this one type.

use sha2::{Digest, Sha256};

/// The keys a client may present; none means no authentication.
#[derive(Clone, Default)]
pub struct ApiKeys {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.digests.len())
    }
}

impl ApiKeys {
    /// Accepts exactly `keys` (empty ones are ignored).
    pub fn new(keys: &[String]) -> Self {
        ApiKeys {
            digests: keys
                .iter()
                .filter(|k| !k.is_empty())
                .map(|k| digest(k.as_bytes()))
                .collect(),
        }
    }

    /// True when no key is configured: every request passes.
    pub fn is_open(&self) -> bool {
        self.digests.is_empty()
    }

    /// Whether the `Authorization` header value carries one of the keys.
    /// Every configured key is compared, matched or not.
    pub fn allows(&self, authorization: Option<&[u8]>) -> bool {
        if self.is_open() {
            return true;
        }
        let Some(token) = authorization.and_then(bearer) else {
            return false;
        };
        let presented = digest(token);
        self.digests
            .iter()
            .fold(false, |ok, d| ok | constant_time_eq(d, &presented))
    }
}

/// The token of `Bearer <token>` (the scheme is case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
        .filter(|t| !t.is_empty())
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Equal digests, looking at every byte.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keeps the compiler from turning the fold into an early exit.
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_configured_key_as_a_bearer_token_passes() {
        let keys = ApiKeys::new(&["sk-one".into(), "two".into(), String::new()]);
        // (Authorization header, allowed)
        let cases: [(Option<&[u8]>, bool); 11] = [
            (Some(b"Bearer sk-one"), true),
            (Some(b"bearer two"), true),
            (Some(b"BEARER  sk-one "), true),
            (Some(b"Bearer sk-on"), false),
            (Some(b"Bearer sk-one2"), false),
            (Some(b"Bearer "), false),
            (Some(b"Bearer"), false),
            (Some(b"Basic c2stb25l"), false),
            (Some(b"sk-one"), false),
            (Some(b""), false),
            (None, false),
        ];
        for (header, want) in cases {
            assert_eq!(
                keys.allows(header),
                want,
                "{:?}",
                header.map(String::from_utf8_lossy)
            );
        }
        assert!(!keys.is_open());
        let open = ApiKeys::new(&[String::new()]);
        assert!(open.is_open() && open.allows(None));
        assert_eq!(format!("{keys:?}"), "ApiKeys(2 keys)", "no key in logs");
    }
}
