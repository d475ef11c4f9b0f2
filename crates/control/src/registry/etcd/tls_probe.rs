//! Why a TLS connection to etcd fails. gRPC reports a refused client certificate as a closed
//! connection, the same words as an etcd that is down; one handshake of our own, made only
//! when TLS is set and etcd looks unreachable, reads the server's alert instead.

use super::EtcdOptions;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An HTTP/2 client preface and an empty SETTINGS frame: the server answers it, or its alert
/// for a certificate it refused arrives in place of the answer.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// The TLS failure at the first `https` endpoint, if the handshake or the first read is
/// refused for a TLS reason; `None` when TLS works or the endpoint cannot be reached at all.
pub(super) async fn tls_failure(opts: &EtcdOptions, timeout: Duration) -> Option<String> {
    let endpoint = opts.endpoints.iter().find(|e| e.starts_with("https://"))?;
    let authority = endpoint.trim_start_matches("https://").split('/').next()?;
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let config = Arc::new(client_config(opts)?);
    let name = ServerName::try_from(host.trim_matches(['[', ']']).to_string()).ok()?;
    let probe = async {
        let tcp = TcpStream::connect(authority).await.ok()?;
        let connector = tokio_rustls::TlsConnector::from(config);
        let mut tls = match connector.connect(name, tcp).await {
            Ok(tls) => tls,
            Err(e) => return Some(e.to_string()),
        };
        tls.write_all(H2_PREFACE).await.ok()?;
        let mut answer = [0u8; 9];
        match tls.read(&mut answer).await {
            Ok(_) => None,
            Err(e) => Some(e.to_string()),
        }
    };
    tokio::time::timeout(timeout, probe).await.ok().flatten()
}

fn client_config(opts: &EtcdOptions) -> Option<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?;
    let mut roots = RootCertStore::empty();
    if let Some(ca) = &opts.cafile {
        for cert in CertificateDer::pem_file_iter(ca).ok()? {
            roots.add(cert.ok()?).ok()?;
        }
    }
    let builder = builder.with_root_certificates(roots);
    match (&opts.certfile, &opts.keyfile) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .ok()?
                .collect::<Result<_, _>>()
                .ok()?;
            let key = PrivateKeyDer::from_pem_file(key).ok()?;
            builder.with_client_auth_cert(chain, key).ok()
        }
        _ => Some(builder.with_no_client_auth()),
    }
}
