//! The router's Service: `--router-service NS/NAME`.

use ferrox_plan::contract::router::PORT;

use crate::Error;

/// The Service in front of ferrox-router's pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterService {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl RouterService {
    /// Reads `NS/NAME`.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let bad = || Error::InvalidSpec(format!("router service {s:?}: want NAMESPACE/NAME"));
        let (namespace, name) = s.split_once('/').ok_or_else(bad)?;
        let dns = |p: &str| {
            !p.is_empty()
                && p.len() <= 63
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !p.starts_with('-')
                && !p.ends_with('-')
        };
        if !dns(namespace) || !dns(name) {
            return Err(bad());
        }
        Ok(RouterService {
            namespace: namespace.into(),
            name: name.into(),
        })
    }

    /// Where clients reach every model through it.
    pub fn url(&self) -> String {
        format!("http://{}.{}.svc:{PORT}", self.name, self.namespace)
    }

    /// The base URL of one of its pods.
    pub fn pod_url(ip: &str) -> String {
        if ip.contains(':') {
            format!("http://[{ip}]:{PORT}")
        } else {
            format!("http://{ip}:{PORT}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_namespace_and_name_and_refuses_the_rest() {
        let r = RouterService::parse("ferrox-system/ferrox-router").unwrap();
        assert_eq!(r.url(), "http://ferrox-router.ferrox-system.svc:8000");
        for bad in [
            "",
            "router",
            "/router",
            "ns/",
            "ns/Router",
            "ns/a/b",
            "-ns/r",
        ] {
            assert!(RouterService::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(RouterService::pod_url("10.1.0.4"), "http://10.1.0.4:8000");
        assert_eq!(RouterService::pod_url("fd00::4"), "http://[fd00::4]:8000");
    }
}
