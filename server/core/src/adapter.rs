//! A LoRA adapter as the engine carries it: the name requests and metrics
//! use, the key its prefix-cache chains are salted with, and the weights,
//! which only the model reads. The engine never sees a tensor library, so
//! the weights travel type-erased and the model downcasts them.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// One loaded adapter. Cheap to clone; while a clone lives (a request in
/// flight holds one) the weights stay in memory.
#[derive(Clone)]
pub struct AdapterRef {
    name: Arc<str>,
    key: Arc<str>,
    weights: Arc<dyn Any + Send + Sync>,
}

impl AdapterRef {
    /// An adapter named `name` whose KV is identified by `key` (its name
    /// and the digest of its weights: what a router computes too).
    pub fn new(name: &str, key: &str, weights: Arc<dyn Any + Send + Sync>) -> Self {
        AdapterRef {
            name: Arc::from(name),
            key: Arc::from(key),
            weights,
        }
    }

    /// The name a request's `model` gives.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the prefix cache salts this adapter's chains with.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The weights, if they are a `T` (the model's adapter type).
    pub fn weights<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.weights.downcast_ref::<T>()
    }

    /// How many hold these weights (the server's store and each request in
    /// flight): one means none but the store.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.weights)
    }

    /// The same loaded adapter (not merely the same name).
    pub fn same(&self, other: &AdapterRef) -> bool {
        Arc::ptr_eq(&self.weights, &other.weights)
    }
}

impl fmt::Debug for AdapterRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdapterRef")
            .field("name", &self.name)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_downcast_to_their_own_type_only() {
        let a = AdapterRef::new("a", "a@1", Arc::new(7u32));
        assert_eq!(a.weights::<u32>(), Some(&7));
        assert_eq!(a.weights::<u64>(), None);
        assert!(a.same(&a.clone()));
        let b = AdapterRef::new("a", "a@1", Arc::new(7u32));
        assert!(
            !a.same(&b),
            "another load of the same name is another adapter"
        );
        assert_eq!((a.name(), a.key()), ("a", "a@1"));
        assert!(format!("{a:?}").contains("a@1"));
    }
}
