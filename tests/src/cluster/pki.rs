//! Certificates and credentials: a CA, the API server's serving certificate, the ServiceAccount signing
//! key and a static admin token. Components and tests authenticate with the token (simplest for kube-rs
//! and kubectl alike); kubelet serves with its self-signed certificate, which the API server does not
//! verify (no `--kubelet-certificate-authority`).

use anyhow::{Context, Result};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use std::fs;
use std::path::Path;

use super::layout::{API_SERVICE_IP, NODE_IP};

/// What the other components need from the PKI.
pub struct Credentials {
    /// The admin bearer token (group `system:masters`).
    pub admin_token: String,
}

/// Writes `ca.crt`, `apiserver.{crt,key}`, `sa.{key,pub}` and `tokens.csv` into `dir`.
pub fn create(dir: &Path) -> Result<Credentials> {
    fs::create_dir_all(dir)?;
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "network-enforcer-local-ca");
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca = Issuer::new(ca_params, ca_key);

    // Every name and address a client may use: kubectl on the host (127.0.0.1, the node IP) and pods
    // through the `kubernetes` Service.
    let serving_names: Vec<String> = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "127.0.0.1",
        NODE_IP,
        API_SERVICE_IP,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(serving_names)?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    let serving_cert = serving.signed_by(&serving_key, &ca)?;

    let sa_key = KeyPair::generate()?;
    let admin_token = random_token()?;

    write(dir, "ca.crt", &ca_cert.pem())?;
    write(dir, "apiserver.crt", &serving_cert.pem())?;
    write(dir, "apiserver.key", &serving_key.serialize_pem())?;
    write(dir, "sa.key", &sa_key.serialize_pem())?;
    // The API server reads public keys from a "PUBLIC KEY" PEM (it does not derive one from PKCS#8).
    write(dir, "sa.pub", &sa_key.public_key_pem())?;
    write(
        dir,
        "tokens.csv",
        &format!("{admin_token},admin,admin,\"system:masters\"\n"),
    )?;
    Ok(Credentials { admin_token })
}

fn write(dir: &Path, name: &str, contents: &str) -> Result<()> {
    let path = dir.join(name);
    fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))
}

/// 32 random bytes from the kernel, hex-encoded.
fn random_token() -> Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A kubeconfig for `server` with the CA and a bearer token.
pub fn kubeconfig(server: &str, ca_file: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: network-enforcer-local
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: admin
  user:
    token: {token}
contexts:
- name: network-enforcer-local
  context:
    cluster: network-enforcer-local
    user: admin
current-context: network-enforcer-local
",
        ca = ca_file.display()
    )
}
