//! TLS for the ingest endpoint.

use super::*;

pub(super) const SERVER_NAME: &str = "fleet-controller.bench.invalid";

impl Pki {
    pub(super) fn create() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("ne-fleet-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "fleet bench CA");
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate()?)?;
        let key = rcgen::KeyPair::generate()?;
        let cert =
            rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()])?.signed_by(&key, &ca)?;
        std::fs::write(dir.join("tls.key"), key.serialize_pem())?;
        std::fs::write(dir.join("tls.crt"), cert.pem())?;
        Ok(Self {
            ca: ca.pem().into_bytes(),
            dir,
        })
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
