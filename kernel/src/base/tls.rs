//! TLS as every part of the kernel uses it (SPEC §29): rustls on ring,
//! the system's roots plus the CAs an operator names (`OPKERNEL_CA` for
//! the kernel's own peers and clients, `OPKERNEL_WEBHOOK_CA` for the
//! webhook's receiver), and the API's server certificate, reloadable.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::base::sync::Lock;

/// The CAs this process trusts beyond the system's roots for the
/// kernel's own HTTP (peers, the CLI, `opkernel mcp`): `OPKERNEL_CA`.
/// Each with its DER (reqwest's certificates cannot be compared).
type Trusted = Vec<(CertificateDer<'static>, reqwest::Certificate)>;
static TRUSTED: Lock<Trusted> = Lock::new(Vec::new());

/// The PEM certificates in `path` (one or more); an error naming the file
/// when it holds none or cannot be read.
pub fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{}: no PEM certificate in it", path.display());
    }
    // each must be usable as a root, or a client built with it fails later
    let mut check = rustls::RootCertStore::empty();
    for cert in &certs {
        check
            .add(cert.clone())
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    Ok(certs)
}

/// `path`'s certificates as reqwest roots.
fn reqwest_roots(path: &Path) -> anyhow::Result<Vec<reqwest::Certificate>> {
    certificates(path)?
        .iter()
        .map(|der| {
            reqwest::Certificate::from_der(der)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
        })
        .collect()
}

/// Adds the CAs in `path` to the roots every client made by [`client`]
/// trusts from now on (a CA already trusted is not added twice).
pub fn trust(path: &Path) -> anyhow::Result<()> {
    let roots = reqwest_roots(path)?;
    let ders = certificates(path)?;
    let mut trusted = TRUSTED.lock();
    for (der, root) in ders.into_iter().zip(roots) {
        if !trusted.iter().any(|(known, _)| *known == der) {
            trusted.push((der, root));
        }
    }
    Ok(())
}

/// A client builder trusting the system's roots and every CA given to
/// [`trust`]: every HTTP client of the kernel, its CLI and `opkernel mcp`
/// starts here.
pub fn client() -> reqwest::ClientBuilder {
    let mut builder = reqwest::Client::builder().use_rustls_tls();
    for (_, root) in TRUSTED.lock().iter() {
        builder = builder.add_root_certificate(root.clone());
    }
    builder
}

/// A client builder trusting the system's roots and the CAs in `extra`
/// only (the webhook's: a receiver is not one of the kernel's peers).
pub fn client_with(extra: Option<&Path>) -> anyhow::Result<reqwest::ClientBuilder> {
    let mut builder = reqwest::Client::builder().use_rustls_tls();
    if let Some(path) = extra {
        for root in reqwest_roots(path)? {
            builder = builder.add_root_certificate(root);
        }
    }
    Ok(builder)
}

/// The system's roots (those that parse; none is an empty store) and the
/// certificates in `extra`.
pub fn root_store(extra: Option<&Path>) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!(%e, "a system root certificate could not be read");
    }
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = extra {
        for cert in certificates(path)? {
            roots
                .add(cert)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        }
    }
    Ok(roots)
}

/// The ring provider, the one this build carries (reqwest 0.12's rustls
/// is on ring too). rustls 0.23.48 marks it deprecated for its lack of
/// post-quantum key exchange; aws-lc-rs has it but would add a second
/// provider and a large C build to every build of the kernel.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: OnceLock<Arc<rustls::crypto::CryptoProvider>> = OnceLock::new();
    #[allow(deprecated)]
    let make = rustls::crypto::ring::default_provider;
    PROVIDER.get_or_init(|| Arc::new(make())).clone()
}

/// The API's certificate and key files (`OPKERNEL_TLS_CERT`,
/// `OPKERNEL_TLS_KEY`) and the server configuration last read from them.
pub struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    current: Lock<Arc<rustls::ServerConfig>>,
}

impl ServerTls {
    /// Reads both files; an error naming the one at fault.
    pub fn load(cert: &Path, key: &Path) -> anyhow::Result<ServerTls> {
        let config = server_config(cert, key)?;
        Ok(ServerTls {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: Lock::new(Arc::new(config)),
        })
    }

    /// The configuration a new connection's handshake uses.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.current.lock().clone()
    }

    /// Reads both files again (SIGHUP): new connections use them, open
    /// ones keep theirs; on an error the old pair stays in force.
    pub fn reload(&self) -> anyhow::Result<()> {
        let config = server_config(&self.cert, &self.key)?;
        *self.current.lock() = Arc::new(config);
        Ok(())
    }
}

/// A server configuration from a PEM chain and its PEM private key.
fn server_config(cert: &Path, key: &Path) -> anyhow::Result<rustls::ServerConfig> {
    let chain = certificates(cert).map_err(|e| e.context("OPKERNEL_TLS_CERT"))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| anyhow::anyhow!("OPKERNEL_TLS_KEY: {}: {e}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| anyhow::anyhow!("OPKERNEL_TLS_CERT and OPKERNEL_TLS_KEY: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
