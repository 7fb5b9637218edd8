//! Built prompt recipes, shared. Replicas of one model publish the same
//! spec and a tokenizer takes tens of MB, so the router builds each
//! distinct spec once, one build at a time (bounding the peak while many
//! endpoints appear together), and keeps it while an endpoint holds it.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use ferrox_prompt::{PrefixSpec, Prompter};
use sha2::{Digest, Sha256};

/// The prompters in use, by the digest of their spec's bytes.
#[derive(Default)]
pub struct Prompters {
    built: tokio::sync::Mutex<HashMap<[u8; 32], Weak<Prompter>>>,
}

impl Prompters {
    /// The prompter `bytes` (a `GET /prefix_spec` body) describes: the one
    /// already built for the same bytes, or a new one.
    pub async fn get(&self, bytes: Vec<u8>) -> Result<Arc<Prompter>, String> {
        let key: [u8; 32] = Sha256::digest(&bytes).into();
        let mut built = self.built.lock().await;
        if let Some(p) = built.get(&key).and_then(Weak::upgrade) {
            return Ok(p);
        }
        built.retain(|_, w| w.strong_count() > 0);
        // Building a tokenizer takes a while: off the async threads.
        let p = tokio::task::spawn_blocking(move || {
            let spec: PrefixSpec = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
            Prompter::new(&spec).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())??;
        let p = Arc::new(p);
        built.insert(key, Arc::downgrade(&p));
        Ok(p)
    }

    /// How many distinct prompters are alive.
    #[cfg(test)]
    pub async fn alive(&self) -> usize {
        let built = self.built.lock().await;
        built.values().filter(|w| w.strong_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `GET /prefix_spec` body: a word-level tokenizer, no template.
    fn spec_bytes(model: &str) -> Vec<u8> {
        let pipeline = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1, "[UNK]": 2}, "unk_token": "[UNK]"}
        });
        let spec = serde_json::json!({
            "model": model, "block_size": 16, "root": null, "max_model_len": 256,
            "tokenizer": {"pipeline": pipeline}, "chat_template": null,
            "template_tokens": [null, null], "tool_calls": false, "describe_tools": false
        });
        serde_json::to_vec(&spec).expect("json")
    }

    #[tokio::test]
    async fn replicas_of_one_spec_share_one_prompter() {
        let ps = Prompters::default();
        let a = ps.get(spec_bytes("m")).await.expect("a");
        let b = ps.get(spec_bytes("m")).await.expect("b");
        assert!(Arc::ptr_eq(&a, &b), "the same spec is built once");
        let c = ps.get(spec_bytes("other")).await.expect("c");
        assert!(!Arc::ptr_eq(&a, &c), "another spec is another prompter");
        assert_eq!(ps.alive().await, 2);
        drop((a, b));
        assert_eq!(ps.alive().await, 1, "held by no endpoint: freed");
        assert!(ps.get(b"not json".to_vec()).await.is_err());
    }
}
