//! Reaching the controller: the endpoint (URL, TLS) checked and connected, and the token read.

use super::*;

/// Checks that `config` describes a usable endpoint (URL, scheme, insecure flag, CA file) without
/// connecting.
pub fn check(config: &UplinkConfig) -> Result<(), UplinkError> {
    endpoint(config).map(drop)
}

/// Opens the connection (TCP, TLS handshake when `https://`, HTTP/2) the uplink streams over. The
/// uplink task calls it at every reconnect; on its own it checks that the controller is reachable and
/// trusted.
pub async fn connect(config: &UplinkConfig) -> Result<Channel, UplinkError> {
    endpoint(config)?
        .connect()
        .await
        .map_err(UplinkError::Connect)
}

pub(super) fn endpoint(config: &UplinkConfig) -> Result<Endpoint, UplinkError> {
    let endpoint =
        Endpoint::from_shared(config.endpoint.clone()).map_err(|source| UplinkError::Endpoint {
            url: config.endpoint.clone(),
            source,
        })?;
    let endpoint = match endpoint.uri().scheme_str() {
        Some("http") if config.insecure => endpoint,
        Some("http") => return Err(UplinkError::Plaintext(config.endpoint.clone())),
        Some("https") => {
            let path = config
                .ca_file
                .as_ref()
                .ok_or_else(|| UplinkError::NoCa(config.endpoint.clone()))?;
            let ca_error = |detail: String| UplinkError::Ca {
                path: path.clone(),
                detail,
            };
            let pem = std::fs::read(path).map_err(|e| ca_error(e.to_string()))?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(ca_error("holds no PEM certificate".into()));
            }
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
            if let Some(name) = &config.server_name {
                tls = tls.domain_name(name.clone());
            }
            endpoint.tls_config(tls).map_err(|e| ca_error(chain(&e)))?
        }
        _ => return Err(UplinkError::Scheme(config.endpoint.clone())),
    };
    Ok(endpoint
        .connect_timeout(config.connect_timeout)
        // A controller that vanished without closing the connection (node lost, network partition)
        // would otherwise leave the stream hanging, with acknowledgements never coming.
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true))
}

/// Reads the projected token. A small file on a tmpfs volume: a blocking read is fine here.
pub(super) fn read_token(path: &Path) -> Result<String, UplinkError> {
    let token = std::fs::read_to_string(path).map_err(|source| UplinkError::Token {
        path: path.to_path_buf(),
        source,
    })?;
    let token = token.trim();
    if token.is_empty() {
        return Err(UplinkError::EmptyToken(path.to_path_buf()));
    }
    Ok(token.to_string())
}
