//! The OTLP exporter's settings from the standard `OTEL_EXPORTER_OTLP_*` variables (the signal
//! specific `OTEL_EXPORTER_OTLP_LOGS_*` one first), parsed without touching the process environment
//! so that the parsing is a pure function.

use std::path::PathBuf;
use std::time::Duration;

/// The default `service.name`.
pub const DEFAULT_SERVICE_NAME: &str = "network-enforcer-controller";
/// The default export timeout (the OpenTelemetry default, 10 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Events waiting for export at most; more are dropped and counted.
pub const DEFAULT_QUEUE_SIZE: usize = 2048;
/// The largest queue (and batch) accepted: it bounds the exporter's memory (events are ~1 KiB), and
/// far larger values would not even fit the channel that holds them.
pub const MAX_QUEUE_SIZE: usize = 1_000_000;
/// Events per export request at most.
pub const DEFAULT_BATCH_SIZE: usize = 512;

/// The OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (`grpc`, the default).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`), POSTed to `<endpoint>/v1/logs`.
    HttpProtobuf,
}

/// Where and how violation events are exported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpConfig {
    /// The full URL: the gRPC server (`https://collector:4317`) or the HTTP logs path
    /// (`https://collector:4318/v1/logs`). `https` turns TLS on.
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    /// Extra request headers (gRPC metadata), e.g. an API key.
    pub headers: Vec<(String, String)>,
    /// How long one export request may take.
    pub timeout: Duration,
    /// PEM file of the CA that signed the collector's certificate (`OTEL_EXPORTER_OTLP_CERTIFICATE`);
    /// without it the system roots are trusted.
    pub ca_certificate: Option<PathBuf>,
    /// PEM client certificate and key for mutual TLS.
    pub client_certificate: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// `service.name` of the resource (`OTEL_SERVICE_NAME`).
    pub service_name: String,
    /// Queue bound (`OTEL_BLRP_MAX_QUEUE_SIZE`).
    pub queue_size: usize,
    /// Batch bound (`OTEL_BLRP_MAX_EXPORT_BATCH_SIZE`).
    pub batch_size: usize,
}

/// A variable with a value the exporter cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: {message}")]
pub struct ConfigError {
    pub variable: String,
    pub message: String,
}

impl OtlpConfig {
    /// A configuration for `endpoint` with every other setting at its default.
    pub fn new(endpoint: impl Into<String>, protocol: OtlpProtocol) -> Self {
        OtlpConfig {
            endpoint: endpoint.into(),
            protocol,
            headers: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            ca_certificate: None,
            client_certificate: None,
            client_key: None,
            service_name: DEFAULT_SERVICE_NAME.to_string(),
            queue_size: DEFAULT_QUEUE_SIZE,
            batch_size: DEFAULT_BATCH_SIZE,
        }
    }

    /// Reads the standard variables through `get` (e.g. `|k| std::env::var(k).ok()`). `Ok(None)`
    /// when no endpoint is configured: export is off.
    ///
    /// `OTEL_EXPORTER_OTLP_LOGS_ENDPOINT` is used as is; `OTEL_EXPORTER_OTLP_ENDPOINT` is the base
    /// URL, to which http/protobuf appends `/v1/logs`. Protocols: `grpc` (default) and
    /// `http/protobuf`; `http/json` is refused. Headers are `key=value` pairs separated by commas,
    /// values percent-decoded. The timeout is in milliseconds.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, ConfigError> {
        let lookup = |name: &str| -> Option<(String, String)> {
            let logs = format!("OTEL_EXPORTER_OTLP_LOGS_{name}");
            let general = format!("OTEL_EXPORTER_OTLP_{name}");
            [logs, general]
                .into_iter()
                .find_map(|var| get(&var).filter(|v| !v.trim().is_empty()).map(|v| (var, v)))
        };
        let error = |variable: &str, message: String| ConfigError {
            variable: variable.to_string(),
            message,
        };

        let protocol = match lookup("PROTOCOL") {
            None => OtlpProtocol::Grpc,
            Some((var, value)) => match value.trim() {
                "grpc" => OtlpProtocol::Grpc,
                "http/protobuf" => OtlpProtocol::HttpProtobuf,
                other => {
                    return Err(error(
                        &var,
                        format!("unsupported protocol {other:?}: expected grpc or http/protobuf"),
                    ));
                }
            },
        };

        let signal_endpoint =
            get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT").filter(|v| !v.trim().is_empty());
        let (variable, endpoint) = match signal_endpoint {
            Some(url) => ("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", url.trim().to_string()),
            None => match get("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|v| !v.trim().is_empty()) {
                None => return Ok(None),
                Some(base) => {
                    let base = base.trim();
                    let url = match protocol {
                        OtlpProtocol::Grpc => base.to_string(),
                        OtlpProtocol::HttpProtobuf => {
                            format!("{}/v1/logs", base.trim_end_matches('/'))
                        }
                    };
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", url)
                }
            },
        };
        let uri: tonic::codegen::http::Uri = endpoint
            .parse()
            .map_err(|e| error(variable, format!("invalid URL {endpoint:?}: {e}")))?;
        match uri.scheme_str() {
            Some("http" | "https") if uri.host().is_some() => {}
            _ => {
                return Err(error(
                    variable,
                    format!("{endpoint:?} must be an http:// or https:// URL with a host"),
                ));
            }
        }

        let headers = match lookup("HEADERS") {
            None => Vec::new(),
            Some((var, value)) => parse_headers(&value).map_err(|m| error(&var, m))?,
        };
        let timeout = match lookup("TIMEOUT") {
            None => DEFAULT_TIMEOUT,
            Some((var, value)) => value
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis)
                .ok_or_else(|| {
                    error(
                        &var,
                        format!("{value:?} is not a positive number of milliseconds"),
                    )
                })?,
        };
        let path = |name: &str| lookup(name).map(|(_, v)| PathBuf::from(v.trim()));
        let ca_certificate = path("CERTIFICATE");
        let client_certificate = path("CLIENT_CERTIFICATE");
        let client_key = path("CLIENT_KEY");
        if client_certificate.is_some() != client_key.is_some() {
            return Err(error(
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                "a client certificate needs its key (OTEL_EXPORTER_OTLP_CLIENT_KEY) and the other way round"
                    .to_string(),
            ));
        }
        let positive = |var: &str, default: usize| -> Result<usize, ConfigError> {
            match get(var).filter(|v| !v.trim().is_empty()) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_QUEUE_SIZE).contains(n))
                    .ok_or_else(|| {
                        error(
                            var,
                            format!("{v:?} is not an integer from 1 to {MAX_QUEUE_SIZE}"),
                        )
                    }),
            }
        };
        let queue_size = positive("OTEL_BLRP_MAX_QUEUE_SIZE", DEFAULT_QUEUE_SIZE)?;
        let batch_size =
            positive("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", DEFAULT_BATCH_SIZE)?.min(queue_size);
        let service_name = get("OTEL_SERVICE_NAME")
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string());

        Ok(Some(OtlpConfig {
            endpoint,
            protocol,
            headers,
            timeout,
            ca_certificate,
            client_certificate,
            client_key,
            service_name,
            queue_size,
            batch_size,
        }))
    }

    /// Whether the endpoint asks for TLS.
    pub fn tls(&self) -> bool {
        self.endpoint.starts_with("https://")
    }
}

/// `k1=v1,k2=v2` with percent-encoded values (the OTLP exporter specification's format).
fn parse_headers(value: &str) -> Result<Vec<(String, String)>, String> {
    let mut headers = Vec::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not `key=value`"))?;
        let key = key.trim();
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(format!("{key:?} is not a valid header name"));
        }
        headers.push((key.to_ascii_lowercase(), percent_decode(value.trim())?));
    }
    Ok(headers)
}

fn percent_decode(value: &str) -> Result<String, String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-encoding in {value:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{value:?} does not decode to UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<Option<OtlpConfig>, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        OtlpConfig::from_env(|k| vars.get(k).cloned())
    }

    #[test]
    fn no_endpoint_means_no_export() {
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]), Ok(None));
        assert_eq!(parse(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]), Ok(None));
    }

    #[test]
    fn defaults_and_every_variable() {
        let c = parse(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317")])
            .unwrap()
            .unwrap();
        assert_eq!(
            c,
            OtlpConfig::new("https://collector:4317", OtlpProtocol::Grpc)
        );
        assert!(c.tls());

        let c = parse(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b, X-Tenant=t1"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/otel/ca.crt"),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/etc/otel/tls.crt"),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/etc/otel/tls.key"),
            ("OTEL_SERVICE_NAME", "ne"),
            ("OTEL_BLRP_MAX_QUEUE_SIZE", "100"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "http://collector:4318/v1/logs");
        assert_eq!(c.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(
            c.headers,
            [
                ("api-key".to_string(), "a b".to_string()),
                ("x-tenant".to_string(), "t1".to_string())
            ]
        );
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.ca_certificate, Some(PathBuf::from("/etc/otel/ca.crt")));
        assert_eq!(
            c.client_certificate,
            Some(PathBuf::from("/etc/otel/tls.crt"))
        );
        assert_eq!(c.client_key, Some(PathBuf::from("/etc/otel/tls.key")));
        assert_eq!(c.service_name, "ne");
        assert_eq!((c.queue_size, c.batch_size), (100, 100));
        assert!(!c.tls());
    }

    #[test]
    fn logs_variables_win_and_their_endpoint_is_used_as_is() {
        let c = parse(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4318"),
            (
                "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
                "http://logs:9999/custom",
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1"),
            ("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "7000"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "http://logs:9999/custom");
        assert_eq!(c.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(c.timeout, Duration::from_secs(7));
    }

    #[test]
    fn bad_values_name_their_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                    ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "http/json"),
                ],
                "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                    ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon"),
                ],
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                    ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
                ],
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                    ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k"),
                ],
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            ),
            // Too large for the queue that holds them (building it used to panic at start-up).
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                    ("OTEL_BLRP_MAX_QUEUE_SIZE", "18446744073709551615"),
                ],
                "OTEL_BLRP_MAX_QUEUE_SIZE",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                    ("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", "1000001"),
                ],
                "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE",
            ),
        ];
        for (vars, variable) in cases {
            let err = parse(vars).unwrap_err();
            assert_eq!(err.variable, *variable, "{err}");
        }
    }
}
