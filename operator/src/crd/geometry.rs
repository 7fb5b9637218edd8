//! `spec.model.geometry` (and `status.geometry.geometry`): ferrox-plan's
//! `ModelGeometry` itself, on the wire and in the schema, so each shape fact
//! is declared once, in ferrox-plan. The one difference is the KV dtype: the
//! user may leave it out, and then the pods' device decides it.

use std::borrow::Cow;

use ferrox_plan::{DeviceKind, KvDtype, ModelGeometry};
use kube::core::Rule;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::ser::Error as _;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

/// The KV dtype's name on the wire (`ModelGeometry`'s camelCase field).
const KV_DTYPE: &str = "kvDtype";

/// The CEL rule refusing a KV dtype the server does not serve, and why.
const FP8_RULE: &str = "!has(self.kvDtype) || self.kvDtype != 'fp8'";
const FP8_MESSAGE: &str =
    "geometry.kvDtype fp8 is not served by ferrox-server yet: use f32, f16 or bf16";

/// The CEL rule keeping at least one attention layer's own KV, and why.
const SHARED_RULE: &str = "!has(self.kvSharedLayers) || self.kvSharedLayers == 0 || \
     self.kvSharedLayers < self.layers - (has(self.recurrentLayers) ? self.recurrentLayers : 0)";
const SHARED_MESSAGE: &str = "geometry.kvSharedLayers must be fewer than the attention layers \
     (layers less recurrentLayers): at least one layer keeps the KV the others share";

/// The CEL rule refusing per-head full-attention shapes beside latent
/// attention, and why.
const LATENT_RULE: &str = "!has(self.kvLatentDim) || self.kvLatentDim == 0 || \
     ((!has(self.fullKvHeads) || self.fullKvHeads == 0) && \
     (!has(self.fullHeadDim) || self.fullHeadDim == 0))";
const LATENT_MESSAGE: &str = "geometry.fullKvHeads and geometry.fullHeadDim shape per-head K and V: \
     leave them out with geometry.kvLatentDim (latent attention caches one vector a layer)";

/// The model's shape facts (the `ferrox-server inspect --json` fields that
/// matter): ferrox-plan's geometry with the KV dtype optional.
#[derive(Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GeometrySpec {
    /// Element type of the KV cache; absent, what the server's `--kv-dtype
    /// auto` picks on the pods' device (f16 on CPU, bf16 on a GPU).
    #[serde(default)]
    pub kv_dtype: Option<KvDtype>,
    /// Every other fact. Its own `kv_dtype` is not read (it is the default,
    /// so that equal specs compare equal): [`GeometrySpec::for_device`]
    /// puts the one above in.
    #[serde(flatten)]
    pub facts: ModelGeometry,
}

impl GeometrySpec {
    /// ferrox-plan's geometry as held on `device`: an absent KV dtype is the
    /// one the server's `--kv-dtype auto` picks there.
    pub fn for_device(&self, device: DeviceKind) -> ModelGeometry {
        ModelGeometry {
            kv_dtype: self.kv_dtype.unwrap_or(device.auto_kv_dtype(KvDtype::Bf16)),
            ..self.facts.clone()
        }
    }
}

impl From<&ModelGeometry> for GeometrySpec {
    fn from(g: &ModelGeometry) -> Self {
        GeometrySpec {
            kv_dtype: Some(g.kv_dtype),
            facts: ModelGeometry {
                kv_dtype: KvDtype::default(),
                ..g.clone()
            },
        }
    }
}

impl Serialize for GeometrySpec {
    // `facts` as ferrox-plan writes it, its KV dtype replaced by ours (a
    // derived flatten would write `kvDtype` twice).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut value = serde_json::to_value(&self.facts).map_err(S::Error::custom)?;
        if let Some(fields) = value.as_object_mut() {
            fields.remove(KV_DTYPE);
            if let Some(d) = self.kv_dtype {
                fields.insert(KV_DTYPE.into(), Value::String(d.name().into()));
            }
        }
        value.serialize(serializer)
    }
}

impl JsonSchema for GeometrySpec {
    fn schema_name() -> Cow<'static, str> {
        "GeometrySpec".into()
    }

    // `ModelGeometry`'s schema, read as Kubernetes reads it, with the KV
    // dtype optional and the rules on it.
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let mut schema = ModelGeometry::json_schema(generator);
        let kv_dtype = generator.subschema_for::<Option<KvDtype>>();
        if let Some(Value::Object(properties)) = schema.get_mut("properties") {
            properties.insert(KV_DTYPE.into(), kv_dtype.to_value());
        }
        let mut value = schema.to_value();
        for_kubernetes(&mut value);
        let mut schema = Schema::try_from(value).expect("a schema stays an object");
        for (rule, message) in [
            (FP8_RULE, FP8_MESSAGE),
            (SHARED_RULE, SHARED_MESSAGE),
            (LATENT_RULE, LATENT_MESSAGE),
        ] {
            kube::core::validate(&mut schema, Rule::new(rule).message(message))
                .expect("a rule serialises");
        }
        schema
    }
}

/// A schema as a Kubernetes API server should get it: integers `int64`
/// (it knows no `uint64`), and no defaults (it would write them into the
/// users' objects, where an absent count or KV dtype must stay absent).
fn for_kubernetes(schema: &mut Value) {
    let Some(fields) = schema.as_object_mut() else {
        return;
    };
    fields.remove("default");
    if fields.get("format").and_then(Value::as_str) == Some("uint64") {
        fields.insert("format".into(), "int64".into());
    }
    if let Some(Value::Object(properties)) = fields.get_mut("properties") {
        properties.values_mut().for_each(for_kubernetes);
    }
    for key in ["items", "anyOf", "oneOf", "allOf"] {
        match fields.get_mut(key) {
            Some(Value::Array(each)) => each.iter_mut().for_each(for_kubernetes),
            Some(one) => for_kubernetes(one),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests;
