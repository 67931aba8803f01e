//! The TLS client configuration of every outbound HTTPS client (the FHIR fetcher, the Schema Registry client):
//! rustls on ring, safe default protocol versions, the platform's trusted roots (`rustls-native-certs`: the
//! system store, or `SSL_CERT_FILE` / `SSL_CERT_DIR`). One place, so the clients cannot drift apart.

use std::sync::Arc;

/// The client configuration and how many trusted roots it holds (a caller that needs https may refuse zero).
pub fn client_config() -> Result<(rustls::ClientConfig, usize), rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let n = roots.len();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok((config, n))
}
