//! PostgreSQL over TLS (SPEC §29): libpq's `sslmode` and `sslrootcert` in
//! the store's URL, honoured by a rustls connector (tokio-postgres itself
//! knows only `disable`, `prefer` and `require`, and no root file).
//!
//! As libpq: `disable` never encrypts; `allow` and `prefer` encrypt when
//! the server can (`allow` is taken as `prefer`); `require` insists on
//! TLS; these three check the server's chain only when `sslrootcert` names
//! a file; `verify-ca` checks the chain; `verify-full` checks the chain and
//! that the certificate names the host. The chain is checked against
//! `sslrootcert` (a PEM file), or the system's roots when it is absent.
//! `sslrootcert=system` (libpq 16) means the system's roots and
//! `verify-full` unless said otherwise, and refuses a weaker mode.
//! Unlike libpq, a `prefer` whose handshake fails does not fall back to
//! plain text, and a certificate must name its host in a subjectAltName
//! (its CN alone is not read).

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres_rustls::MakeRustlsConnect;

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Encrypted, the server unchecked (`prefer`, `require` without a
    /// root file).
    Nothing,
    /// The chain, not the name (`verify-ca`, `require` with a root file).
    Chain,
    /// The chain and the host's name (`verify-full`).
    Full,
}

/// The URL as tokio-postgres reads it, and the connector its TLS needs.
pub struct Split {
    /// `url` with `sslrootcert` removed and `sslmode` one tokio-postgres
    /// knows.
    pub url: String,
    /// What is checked of the server's certificate.
    pub check: Check,
    /// `sslrootcert`'s file (none: the system's roots).
    pub root: Option<PathBuf>,
    /// The `sslmode` tokio-postgres is given.
    pub mode: &'static str,
}

/// Where `url`'s query starts: the first `?` after the credentials (a
/// password may hold a `?`; its `@` ends them).
fn query_start(url: &str) -> Option<usize> {
    let after = url.find("://").map_or(0, |i| i + 3);
    let authority_end = url[after..].find('/').map_or(url.len(), |i| after + i);
    let from = url[after..authority_end]
        .rfind('@')
        .map_or(after, |i| after + i + 1);
    url[from..].find('?').map(|i| from + i)
}

/// Reads `sslmode` and `sslrootcert` out of `url`'s query.
pub fn split(url: &str) -> Result<Split, String> {
    let (base, query) = match query_start(url) {
        Some(i) => (&url[..i], &url[i + 1..]),
        None => (url, ""),
    };
    let mut kept = Vec::new();
    let (mut mode, mut root) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => mode = Some(decode(value)),
            "sslrootcert" => root = Some(decode(value)),
            _ => kept.push(pair.to_owned()),
        }
    }
    let system = root.as_deref() == Some("system");
    let mode = mode.unwrap_or_else(|| if system { "verify-full" } else { "prefer" }.to_owned());
    if system && mode != "verify-full" {
        return Err(format!(
            "OPKERNEL_STORE: sslrootcert=system needs sslmode=verify-full, not {mode:?} (as libpq)"
        ));
    }
    let root = root.filter(|_| !system).map(PathBuf::from);
    let checked = if root.is_some() {
        Check::Chain
    } else {
        Check::Nothing
    };
    let (pg_mode, check) = match mode.as_str() {
        "disable" => ("disable", Check::Nothing),
        "allow" | "prefer" => ("prefer", checked),
        "require" => ("require", checked),
        "verify-ca" => ("require", Check::Chain),
        "verify-full" => ("require", Check::Full),
        other => {
            return Err(format!(
                "OPKERNEL_STORE: sslmode={other:?} is not one of disable, allow, prefer, \
                 require, verify-ca, verify-full"
            ))
        }
    };
    kept.push(format!("sslmode={pg_mode}"));
    Ok(Split {
        url: format!("{base}?{}", kept.join("&")),
        check,
        root,
        mode: pg_mode,
    })
}

/// `%XX` escapes decoded (a path in a URL).
fn decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The connector for `split`'s checks.
pub fn connector(split: &Split) -> Result<PgTls, String> {
    let roots = crate::base::tls::root_store(split.root.as_deref())
        .map_err(|e| format!("OPKERNEL_STORE sslrootcert: {e:#}"))?;
    let provider = crate::base::tls::provider();
    let webpki =
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let config = match (split.check, webpki) {
        (Check::Full, Ok(webpki)) => builder.with_webpki_verifier(webpki),
        (check, webpki) => {
            let chain = match (check, webpki) {
                (Check::Chain, Ok(webpki)) => Some(webpki),
                (Check::Nothing, _) => None,
                (_, Err(e)) => {
                    return Err(format!(
                        "OPKERNEL_STORE: no root certificate to check the server with: {e}"
                    ))
                }
                (Check::Full, Ok(_)) => unreachable!("matched above"),
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Lenient { chain, provider }))
        }
    }
    .with_no_client_auth();
    Ok(PgTls {
        inner: MakeRustlsConnect::new(config),
        named: split.check == Check::Full,
    })
}

/// The rustls connector, also for a connection without a host name (a
/// Unix socket, which tokio-postgres never encrypts, or `hostaddr` alone):
/// there any name stands in, unless the name is what `verify-full` checks.
#[derive(Clone)]
pub struct PgTls {
    inner: MakeRustlsConnect,
    named: bool,
}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, hostname: &str) -> Result<Self::TlsConnect, Self::Error> {
        let name = match hostname {
            "" if !self.named => "localhost",
            name => name,
        };
        MakeTlsConnect::<S>::make_tls_connect(&mut self.inner, name)
    }
}

/// `prefer`/`require` (no check) and `verify-ca` (the chain, any name):
/// the handshake's signatures are always checked.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_modes_map_to_what_is_checked() {
        let s = split("postgres://u@h:5432/db").unwrap();
        assert_eq!(
            (s.url.as_str(), s.check),
            ("postgres://u@h:5432/db?sslmode=prefer", Check::Nothing)
        );
        let s = split(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(
            s.url,
            "postgres://u@h/db?application_name=x&sslmode=require"
        );
        assert_eq!(
            (s.check, s.root),
            (Check::Full, Some(PathBuf::from("/tmp/ca.pem")))
        );
        for (mode, check) in [
            ("disable", Check::Nothing),
            ("allow", Check::Nothing),
            ("require", Check::Nothing),
            ("verify-ca", Check::Chain),
        ] {
            let s = split(&format!("postgres://h/db?sslmode={mode}")).unwrap();
            assert_eq!(s.check, check, "{mode}");
        }
        let s = split("postgres://h/db?sslmode=require&sslrootcert=/ca.pem").unwrap();
        assert_eq!(
            s.check,
            Check::Chain,
            "require with a root file checks the chain"
        );
        let s = split("postgres://h/db?sslrootcert=system").unwrap();
        assert_eq!(
            (s.root, s.check),
            (None, Check::Full),
            "system: verify-full"
        );
        let weak = split("postgres://h/db?sslmode=require&sslrootcert=system");
        assert!(weak.err().unwrap_or_default().contains("verify-full"));
        let s = split("postgres://h/db?sslmode=prefer&sslrootcert=/ca.pem").unwrap();
        assert_eq!(s.check, Check::Chain, "a root file: the chain is checked");
        // a password may hold a `?`: the query starts after the credentials
        let s = split("postgres://u:p?w@h:5432/db?sslmode=require").unwrap();
        assert_eq!(s.url, "postgres://u:p?w@h:5432/db?sslmode=require");
        let s = split("postgres://u:p?w@h/db").unwrap();
        assert_eq!(s.url, "postgres://u:p?w@h/db?sslmode=prefer");
        let bogus = split("postgres://h/db?sslmode=bogus")
            .err()
            .unwrap_or_default();
        assert!(bogus.contains("bogus"), "{bogus}");
    }
}
