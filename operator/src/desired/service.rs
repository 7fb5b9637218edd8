//! The Service in front of the server pods.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::{child_meta, selector_labels};
use crate::Error;
use crate::crd::ModelDeployment;
use crate::router::RouterService;

/// Where clients reach `md` (`status.url`): the router when one is known
/// (it holds requests while the model is at zero), else the model's Service.
pub fn url(md: &ModelDeployment, router: Option<&RouterService>) -> String {
    match router {
        Some(r) => r.url(),
        None => format!(
            "http://{}.{}.svc:{}",
            md.name_any(),
            md.namespace().unwrap_or_default(),
            md.spec.service.port
        ),
    }
}

/// The Service for `md`, named like it.
pub fn service(md: &ModelDeployment) -> Result<Service, Error> {
    Ok(Service {
        metadata: child_meta(md, md.name_any())?,
        spec: Some(ServiceSpec {
            type_: Some(md.spec.service.type_.clone()),
            selector: Some(selector_labels(md)),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: md.spec.service.port,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_is_the_routers_when_there_is_one() {
        let md = crate::fixtures::md("llama", crate::fixtures::gpu_spec(1, "80Gi"));
        assert_eq!(url(&md, None), "http://llama.default.svc:8000");
        let r = RouterService::parse("ferrox/ferrox-router").unwrap();
        assert_eq!(url(&md, Some(&r)), "http://ferrox-router.ferrox.svc:8000");
    }
    use crate::fixtures::{gpu_spec, md};

    #[test]
    fn service_targets_the_named_port() {
        let mut spec = gpu_spec(1, "80Gi");
        spec.service.port = 80;
        spec.service.type_ = "LoadBalancer".into();
        let svc = service(&md("llama", spec)).unwrap();
        let s = svc.spec.unwrap();
        assert_eq!(s.type_.as_deref(), Some("LoadBalancer"));
        let port = &s.ports.unwrap()[0];
        assert_eq!(port.port, 80);
        assert_eq!(port.target_port, Some(IntOrString::String("http".into())));
        assert_eq!(s.selector.unwrap()["app.kubernetes.io/instance"], "llama");
    }
}
