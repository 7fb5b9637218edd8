//! The name a model is served under: what clients send, what the router
//! counts pending requests by, what status reports.

use kube::ResourceExt;

use crate::crd::ModelDeployment;

/// The model name clients send: `spec.model.servedName`, else `metadata.name`.
pub fn served_name(md: &ModelDeployment) -> String {
    md.spec
        .model
        .served_name
        .clone()
        .unwrap_or_else(|| md.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{cpu_spec, md};

    #[test]
    fn the_spec_s_name_else_the_resource_s() {
        let mut spec = cpu_spec("1Gi");
        spec.model.served_name = Some("chat".into());
        assert_eq!(served_name(&md("smol", spec.clone())), "chat");
        spec.model.served_name = None;
        assert_eq!(served_name(&md("smol", spec)), "smol");
    }
}
