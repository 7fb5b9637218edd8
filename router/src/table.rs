//! The endpoint table: every model the router knows, its endpoints, what
//! each holds and how busy it is; routing a request through
//! [`choose`](crate::choose) and counting it in flight. Pure: the shell
//! feeds it what the endpoint sources and pollers saw, with `now`.

use std::collections::BTreeMap;
use std::sync::Arc;

use ferrox_core::{BlockHash, KvEventsPage};
use ferrox_plan::{KvTier, TierWeights};
use ferrox_prompt::Prompter;

use crate::choice::{Affinity, Candidate, Decision, choose_weighted};
use crate::holdings::Holdings;
use crate::load::{Bounds, Load};
use crate::lower_tiers::LowerTiers;

/// One endpoint of a model.
#[derive(Debug)]
pub struct Endpoint<D> {
    /// Its source says it is ready (Kubernetes: the EndpointSlice condition;
    /// static: always).
    pub source_ready: bool,
    /// Its last poll answered (a loading or dead server does not).
    pub reachable: bool,
    /// What its device pool holds.
    pub holdings: Holdings<D>,
    /// What its lower KV tiers (host memory, disk) hold.
    pub lower: LowerTiers<D>,
    /// The server's last reported queue and KV usage; `in_flight` is ours.
    pub load: Load,
    /// Its prompt recipe, once fetched.
    pub prompter: Option<Arc<Prompter>>,
    /// The LoRA adapters its `/v1/models` lists: name -> prefix-cache key
    /// (absent while the adapter is not in the server's memory).
    pub adapters: BTreeMap<String, Option<String>>,
}

impl<D: Ord + Copy> Endpoint<D> {
    fn new(source_ready: bool) -> Self {
        Endpoint {
            source_ready,
            reachable: false,
            holdings: Holdings::new(),
            lower: LowerTiers::new(),
            load: Load::default(),
            prompter: None,
            adapters: BTreeMap::new(),
        }
    }

    /// Ready to take requests.
    pub fn ready(&self) -> bool {
        self.source_ready && self.reachable
    }
}

/// How the table routes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouteSettings<D> {
    /// The load bounds.
    pub bounds: Bounds,
    /// CHWBL's load factor.
    pub load_factor: f64,
    /// Until when a routed chain counts as held before the server says so.
    pub expect_until: D,
}

/// What a sync changed: endpoints to start and stop polling.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// (model, endpoint) new.
    pub added: Vec<(String, String)>,
    /// (model, endpoint) gone.
    pub removed: Vec<(String, String)>,
}

/// Every model and its endpoints, by name.
#[derive(Debug, Default)]
pub struct Table<D> {
    models: BTreeMap<String, BTreeMap<String, Endpoint<D>>>,
    /// LoRA adapters the deployments declare: adapter -> its model (known
    /// at zero replicas too, so a request for one wakes its model).
    declared: BTreeMap<String, String>,
    /// What a block held in each KV tier counts for.
    weights: TierWeights,
}

/// What a request's `model` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The served model whose endpoints serve it.
    pub model: String,
    /// The LoRA adapter, when it names one.
    pub adapter: Option<String>,
}

impl<D: Ord + Copy> Table<D> {
    /// No models.
    pub fn new() -> Self {
        Self::with_weights(TierWeights::default())
    }

    /// No models; blocks in each KV tier count `weights`.
    pub fn with_weights(weights: TierWeights) -> Self {
        Table {
            models: BTreeMap::new(),
            declared: BTreeMap::new(),
            weights,
        }
    }

    /// The LoRA adapters the deployments declare: adapter -> model.
    pub fn declare_adapters(&mut self, declared: BTreeMap<String, String>) {
        self.declared = declared;
    }

    /// What `name` (a request's `model`) is: a served model, an adapter a
    /// deployment declares, or an adapter some endpoint lists.
    pub fn resolve(&self, name: &str) -> Option<Target> {
        if self.models.contains_key(name) {
            return Some(Target {
                model: name.to_string(),
                adapter: None,
            });
        }
        let listed = || {
            let mut all = self
                .models
                .iter()
                .flat_map(|(m, eps)| eps.values().map(move |e| (m, e)));
            all.find(|(_, e)| e.adapters.contains_key(name))
                .map(|(m, _)| m)
        };
        let model = self
            .declared
            .get(name)
            .filter(|m| self.models.contains_key(*m))
            .or_else(listed)?;
        Some(Target {
            model: model.clone(),
            adapter: Some(name.to_string()),
        })
    }

    /// Every adapter known: (adapter, its model), declared or listed.
    pub fn adapters(&self) -> BTreeMap<String, String> {
        let mut out = self.declared.clone();
        for (m, eps) in &self.models {
            for e in eps.values() {
                for a in e.adapters.keys() {
                    out.entry(a.clone()).or_insert_with(|| m.clone());
                }
            }
        }
        out.retain(|_, m| self.models.contains_key(m));
        out
    }

    /// The prefix-cache key of `adapter` on `model`'s endpoints (the first
    /// that reports one).
    pub fn adapter_key(&self, model: &str, adapter: &str) -> Option<String> {
        let endpoints = self.models.get(model)?;
        endpoints
            .values()
            .find_map(|e| e.adapters.get(adapter).cloned().flatten())
    }

    /// Makes the table exactly `wanted`: model -> [(endpoint, ready)]. A
    /// model listed with no endpoints is known (it may scale from zero).
    pub fn sync(&mut self, wanted: &BTreeMap<String, Vec<(String, bool)>>) -> Changes {
        let mut changes = Changes::default();
        for (model, endpoints) in &self.models {
            for name in endpoints.keys() {
                let kept = wanted
                    .get(model)
                    .is_some_and(|w| w.iter().any(|(n, _)| n == name));
                if !kept {
                    changes.removed.push((model.clone(), name.clone()));
                }
            }
        }
        self.models.retain(|m, _| wanted.contains_key(m));
        for (model, list) in wanted {
            let endpoints = self.models.entry(model.clone()).or_default();
            endpoints.retain(|n, _| list.iter().any(|(w, _)| w == n));
            for (name, ready) in list {
                match endpoints.get_mut(name) {
                    Some(e) => e.source_ready = *ready,
                    None => {
                        endpoints.insert(name.clone(), Endpoint::new(*ready));
                        changes.added.push((model.clone(), name.clone()));
                    }
                }
            }
        }
        changes
    }

    /// The known models.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }

    /// True when `model` is known.
    pub fn knows(&self, model: &str) -> bool {
        self.models.contains_key(model)
    }

    /// True when some endpoint of `model` is ready.
    pub fn has_ready(&self, model: &str) -> bool {
        self.models
            .get(model)
            .is_some_and(|e| e.values().any(Endpoint::ready))
    }

    /// One endpoint, to record what its poller saw.
    pub fn endpoint_mut(&mut self, model: &str, name: &str) -> Option<&mut Endpoint<D>> {
        self.models.get_mut(model)?.get_mut(name)
    }

    /// Applies a page of an endpoint's event log (and marks it reachable).
    pub fn apply_events(&mut self, model: &str, name: &str, page: &KvEventsPage) {
        if let Some(e) = self.endpoint_mut(model, name) {
            e.holdings.apply(page);
            e.lower.device_epoch(page.epoch);
            e.reachable = true;
        }
    }

    /// Applies a page of one of an endpoint's lower tiers' logs (it says
    /// nothing of the endpoint's reachability: its device log does).
    pub fn apply_tier_events(
        &mut self,
        model: &str,
        name: &str,
        tier: KvTier,
        page: &KvEventsPage,
    ) {
        if let Some(e) = self.endpoint_mut(model, name) {
            e.lower.apply(tier, page);
        }
    }

    /// The prompt recipe of `model`: its first ready endpoint's by name
    /// (replicas of one model share one).
    pub fn prompter(&self, model: &str) -> Option<Arc<Prompter>> {
        let endpoints = self.models.get(model)?;
        let mut with = endpoints.values().filter(|e| e.prompter.is_some());
        let e = with.clone().find(|e| e.ready()).or_else(|| with.next())?;
        e.prompter.clone()
    }

    /// Chooses an endpoint of `target`'s model for a request with `chain`
    /// (or, with none, `text`), counts it in flight there and expects its
    /// chain held there; `None` when no endpoint of the model is ready. A
    /// request for an adapter goes to an endpoint that has it loaded when
    /// one does (then by prefix and load as any request).
    pub fn route(
        &mut self,
        target: &Target,
        chain: Option<&[BlockHash]>,
        text: &str,
        now: D,
        settings: &RouteSettings<D>,
    ) -> Option<(String, Decision)> {
        let endpoints = self.models.get_mut(&target.model)?;
        for e in endpoints.values_mut() {
            e.holdings.prune(now);
        }
        let mut ready: Vec<(&String, &Endpoint<D>)> =
            endpoints.iter().filter(|(_, e)| e.ready()).collect();
        if let Some(a) = &target.adapter
            && ready.iter().any(|(_, e)| e.adapters.contains_key(a))
        {
            ready.retain(|(_, e)| e.adapters.contains_key(a));
        }
        let runs: Vec<(usize, f64)> = (ready.iter())
            .map(|(_, e)| {
                chain.map_or((0, 0.0), |c| {
                    e.lower.weighted_run(&e.holdings, c, now, &self.weights)
                })
            })
            .collect();
        let candidates: Vec<Candidate<'_>> = (ready.iter().zip(&runs))
            .map(|((name, e), &(held, _))| Candidate {
                name,
                load: e.load,
                held,
            })
            .collect();
        let scores: Vec<f64> = runs.iter().map(|&(_, score)| score).collect();
        let first = chain
            .and_then(|c| c.first())
            .map(ToString::to_string)
            .unwrap_or_default();
        let affinity = match chain {
            Some(_) => Affinity::Blocks(&first),
            None => Affinity::Text(text),
        };
        let mut d = choose_weighted(
            &candidates,
            &scores,
            affinity,
            &settings.bounds,
            settings.load_factor,
        )?;
        let name = ready[d.index].0.clone();
        let e = endpoints.get_mut(&name)?;
        e.load.in_flight += 1;
        if let Some(chain) = chain {
            // Before the expectation below counts the whole chain as the
            // device's.
            d.predicted_by_tier = e.lower.run_by_tier(&e.holdings, chain, now, &self.weights);
            e.holdings.expect(chain, settings.expect_until);
        }
        Some((name, d))
    }

    /// `name` refused a connection: not ready until its poller reaches it.
    pub fn mark_unreachable(&mut self, model: &str, name: &str) {
        if let Some(e) = self.endpoint_mut(model, name) {
            e.reachable = false;
        }
    }

    /// A request routed to `name` ended; its in-flight count now.
    pub fn finish(&mut self, model: &str, name: &str) -> usize {
        match self.endpoint_mut(model, name) {
            Some(e) => {
                e.load.in_flight = e.load.in_flight.saturating_sub(1);
                e.load.in_flight
            }
            None => 0,
        }
    }

    /// In flight at `name`.
    pub fn in_flight(&self, model: &str, name: &str) -> usize {
        self.models
            .get(model)
            .and_then(|e| e.get(name))
            .map_or(0, |e| e.load.in_flight)
    }
}

#[cfg(test)]
mod tests;
