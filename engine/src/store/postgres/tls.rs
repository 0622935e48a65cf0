//! TLS to the PostgreSQL server, with libpq's meaning of the URL's parameters, so that a URL copied from
//! `psql` connects the same way: `sslmode` (`disable`, `prefer` (the default), `require`, `verify-ca`,
//! `verify-full`), `sslrootcert` (a PEM file of certificate authorities, or `system` for this machine's),
//! and `sslcert` with `sslkey` (a client certificate and its key, PEM).
//!
//! tokio-postgres reads only `sslmode=disable|prefer|require` and refuses other keys, so these are taken
//! out of the URL here and the rest handed to it. What is checked of the server's certificate:
//! - `prefer`, `require`: nothing (the connection is encrypted, the server not authenticated), unless
//!   `sslrootcert` is given: then its chain, as with `verify-ca`;
//! - `verify-ca`: its chain up to a certificate authority of `sslrootcert`, not the host name;
//! - `verify-full`: its chain and that it is made out to the host of the URL.
//!
//! `sslrootcert=system` implies `verify-full`, and a weaker `sslmode` with it is refused (libpq 16). Unlike
//! libpq, no default files (`~/.postgresql/root.crt`, `postgresql.crt`, `postgresql.key`) are read.
//! Whatever is checked, the handshake's signatures are always verified.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::store::StoreError;

/// The URL parameters read here (libpq's), which tokio-postgres does not know.
const KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// libpq's `sslmode`, less `allow`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told: whether to ask for TLS, and whether a server without it will do.
    fn negotiation(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        }
    }
}

/// What is checked of the server's certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// Nothing: the connection is encrypted, but anyone in the middle could be the server.
    Nothing,
    /// Its chain up to a trusted certificate authority, not the name it is made out to.
    Chain,
    /// Its chain and that it is made out to the host connected to.
    ChainAndName,
}

/// How the store's connections (the pool's and the listeners') make TLS: cheap to clone.
#[derive(Clone)]
pub(crate) struct Tls {
    pub mode: SslMode,
    pub check: Check,
    pub connector: Connector,
}

/// Makes the TLS of a connection, given the host connected to. tokio-postgres asks for it before it
/// knows whether TLS is used, naming no host for a Unix-domain socket, which rustls refuses: such a
/// connection never uses TLS ([`configure`]), so any valid name stands in for the missing one.
#[derive(Clone)]
pub(crate) struct Connector(MakeRustlsConnect);

impl<S> tokio_postgres::tls::MakeTlsConnect<S> for Connector
where
    MakeRustlsConnect: tokio_postgres::tls::MakeTlsConnect<S>,
{
    type Stream = <MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<S>>::Stream;
    type TlsConnect = <MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<S>>::TlsConnect;
    type Error = <MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, host: &str) -> Result<Self::TlsConnect, Self::Error> {
        self.0
            .make_tls_connect(if host.is_empty() { "localhost" } else { host })
    }
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("mode", &self.mode)
            .field("check", &self.check)
            .finish_non_exhaustive()
    }
}

/// The TLS parameters of a URL, as given (percent-decoded).
#[derive(Default)]
struct Params {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    sslcert: Option<String>,
    sslkey: Option<String>,
}

/// `url` without its TLS parameters (for tokio-postgres), and the TLS they ask for; `shown` is the URL as
/// messages show it.
pub(crate) fn from_url(url: &str, shown: &str) -> Result<(String, Tls), StoreError> {
    let (rest, params) = split(url);
    let fail = |message: String| StoreError::new(format!("run store `{shown}`: {message}"));
    let system = params.sslrootcert.as_deref() == Some("system");
    let mode = match params.sslmode.as_deref() {
        Some(given) => SslMode::parse(given).ok_or_else(|| {
            fail(
                "`sslmode` must be one of `disable`, `prefer`, `require`, `verify-ca`, `verify-full`"
                    .to_owned(),
            )
        })?,
        None if system => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    if system && mode != SslMode::VerifyFull && mode != SslMode::Disable {
        return Err(fail(format!(
            "`sslmode={}` is too weak for `sslrootcert=system`",
            mode.name()
        ))
        .with_hint("use `sslmode=verify-full` (the default with `sslrootcert=system`)"));
    }
    let check = match mode {
        SslMode::Disable => Check::Nothing,
        SslMode::Prefer | SslMode::Require if params.sslrootcert.is_none() => Check::Nothing,
        SslMode::Prefer | SslMode::Require | SslMode::VerifyCa => Check::Chain,
        SslMode::VerifyFull => Check::ChainAndName,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(format!("cannot set up tls: {e}")))?;
    // (With `disable`, never used: tokio-postgres is told not to ask for TLS.)
    let builder = if check == Check::Nothing {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoCheck(provider)))
    } else {
        let Some(root) = params.sslrootcert.as_deref() else {
            return Err(fail(format!(
                "`sslmode={}` needs `sslrootcert`, the certificate authorities to check the server's certificate against",
                mode.name()
            ))
            .with_hint(
                "name their PEM file (`sslrootcert=/path/to/root.crt`), or `sslrootcert=system` for this machine's",
            ));
        };
        let roots = roots(root).map_err(fail)?;
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| {
                fail(format!(
                    "cannot check certificates against `sslrootcert`: {e}"
                ))
            })?;
        if check == Check::Chain {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(verifier)))
        } else {
            builder.with_webpki_verifier(verifier)
        }
    };
    let config = match (&params.sslcert, &params.sslkey) {
        (Some(cert), Some(key)) if mode != SslMode::Disable => {
            let certs = certificates("sslcert", cert).map_err(fail)?;
            let key = private_key(key).map_err(fail)?;
            builder.with_client_auth_cert(certs, key).map_err(|e| {
                fail(format!(
                    "the client certificate of `sslcert` cannot be used: {}",
                    lowercase(&e.to_string())
                ))
            })?
        }
        (Some(_), None) if mode != SslMode::Disable => {
            return Err(fail(
                "`sslcert` needs `sslkey`, the client certificate's private key".to_owned(),
            ));
        }
        (None, Some(_)) if mode != SslMode::Disable => {
            return Err(fail(
                "`sslkey` needs `sslcert`, the client certificate it is the key of".to_owned(),
            ));
        }
        _ => builder.with_no_client_auth(),
    };
    Ok((
        rest,
        Tls {
            mode,
            check,
            connector: Connector(MakeRustlsConnect::new(config)),
        },
    ))
}

/// Tells tokio-postgres whether to ask for TLS. As libpq, not over Unix-domain sockets, whatever the
/// `sslmode` (the server never speaks TLS there, and only processes of this host reach them): a URL whose
/// hosts are all sockets connects without it.
pub(crate) fn configure(config: &mut tokio_postgres::Config, tls: &Tls) {
    let hosts = config.get_hosts().len();
    config.ssl_mode(if hosts > 0 && sockets(config).len() == hosts {
        tokio_postgres::config::SslMode::Disable
    } else {
        tls.mode.negotiation()
    });
}

/// The Unix-domain sockets among the hosts of `config`, as the server names them (`DIR/.s.PGSQL.PORT`).
pub(crate) fn sockets(config: &tokio_postgres::Config) -> Vec<String> {
    let ports = config.get_ports();
    config
        .get_hosts()
        .iter()
        .enumerate()
        .filter_map(|(i, host)| match host {
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(dir) => {
                // One port for every host, or one each (tokio-postgres's rule); 5432 by default.
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                Some(dir.join(format!(".s.PGSQL.{port}")).display().to_string())
            }
            tokio_postgres::config::Host::Tcp(_) => None,
        })
        .collect()
}

/// `url` without the parameters of [`KEYS`] (the others as they were), and those parameters' values (the
/// last of each, as libpq takes it).
fn split(url: &str) -> (String, Params) {
    let mut params = Params::default();
    let Some((head, query)) = url.split_once('?') else {
        return (url.to_owned(), params);
    };
    let mut kept = Vec::new();
    for part in query.split('&') {
        let (key, value) = part.split_once('=').unwrap_or((part, ""));
        let key = decode(key);
        if !KEYS.contains(&key.as_str()) {
            kept.push(part);
            continue;
        }
        let value = Some(decode(value));
        match key.as_str() {
            "sslmode" => params.sslmode = value,
            "sslrootcert" => params.sslrootcert = value,
            "sslcert" => params.sslcert = value,
            _ => params.sslkey = value,
        }
    }
    let rest = if kept.is_empty() {
        head.to_owned()
    } else {
        format!("{head}?{}", kept.join("&"))
    };
    (rest, params)
}

fn decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

/// The certificate authorities of `sslrootcert`: a PEM file, or `system` for this machine's.
fn roots(root: &str) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    if root == "system" {
        let found = rustls_native_certs::load_native_certs();
        let (added, _) = store.add_parsable_certificates(found.certs);
        if added == 0 {
            let why = found
                .errors
                .first()
                .map(|e| format!(": {}", lowercase(&e.to_string())))
                .unwrap_or_default();
            return Err(format!(
                "`sslrootcert=system` found no certificate authority on this machine{why}"
            ));
        }
        return Ok(store);
    }
    let certs = certificates("sslrootcert", root)?;
    let (added, _) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!(
            "`sslrootcert` file `{root}` holds no certificate that can be used"
        ));
    }
    Ok(store)
}

/// The PEM certificates in file `path`, given as parameter `param`.
fn certificates(param: &str, path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = read(param, path)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| {
            format!(
                "`{param}` file `{path}` is not valid PEM: {}",
                lowercase(&e.to_string())
            )
        })?;
    if certs.is_empty() {
        return Err(format!("`{param}` file `{path}` holds no PEM certificate"));
    }
    Ok(certs)
}

/// The PEM private key in file `path` (`sslkey`).
fn private_key(path: &str) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = read("sslkey", path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            format!("`sslkey` file `{path}` holds no PEM private key")
        }
        e => format!(
            "`sslkey` file `{path}` is not valid PEM: {}",
            lowercase(&e.to_string())
        ),
    })
}

/// The bytes of file `path`, given as parameter `param`.
fn read(param: &str, path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file".to_owned(),
            std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
            _ => lowercase(&e.to_string()),
        };
        format!("cannot read `{param}` file `{path}`: {why}")
    })
}

fn lowercase(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Takes any certificate (`prefer`, `require` without `sslrootcert`), as libpq does; the handshake's
/// signatures are still verified, with the certificate's key.
#[derive(Debug)]
struct NoCheck(Arc<CryptoProvider>);

impl ServerCertVerifier for NoCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Checks the certificate's chain but not the name it is made out to (`verify-ca`): the web PKI check,
/// less its last step. rustls checks the name only once the chain is good, so a name that does not match
/// is the only failure let through.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            outcome => outcome,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// What a failed TLS handshake means to the user, when `error` (a connection's) is one: the message after
/// the store's name, and a hint.
pub(crate) fn explain(
    error: &tokio_postgres::Error,
    tls: &Tls,
) -> Option<(String, Option<&'static str>)> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = source {
        let found = cause.downcast_ref::<rustls::Error>().or_else(|| {
            cause
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(found) = found {
            return Some(match found {
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => (
                    "tls handshake failed: the server's certificate is not signed by a certificate authority of `sslrootcert`".to_owned(),
                    Some("`sslrootcert` names the certificate authorities to trust: a PEM file, or `system` for this machine's"),
                ),
                rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                    expected,
                    ..
                }) => (
                    format!(
                        "tls handshake failed: the server's certificate is not made out to `{}`",
                        expected.to_str()
                    ),
                    Some("connect by a name the certificate is made out to, or check its chain only with `sslmode=verify-ca`"),
                ),
                rustls::Error::InvalidCertificate(CertificateError::NotValidForName) => (
                    "tls handshake failed: the server's certificate is not made out to the host connected to".to_owned(),
                    Some("connect by a name the certificate is made out to, or check its chain only with `sslmode=verify-ca`"),
                ),
                rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired) => (
                    "tls handshake failed: the server wants a client certificate".to_owned(),
                    Some("give one, and its key, as PEM files with `sslcert` and `sslkey`"),
                ),
                other => (
                    format!("tls handshake failed: {}", lowercase(&other.to_string())),
                    None,
                ),
            });
        }
        if cause.to_string() == "server does not support TLS" {
            return Some((
                format!(
                    "the server does not accept tls connections, which `sslmode={}` requires",
                    tls.mode.name()
                ),
                Some(
                    "turn `ssl` on in the server's configuration, or connect without tls with `sslmode=prefer` or `disable`",
                ),
            ));
        }
        source = cause.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rest(url: &str) -> String {
        split(url).0
    }

    #[test]
    fn the_tls_parameters_are_taken_out_of_the_url_and_the_others_kept_as_they_were() {
        assert_eq!(rest("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            rest("postgres://u@h/db?sslmode=require"),
            "postgres://u@h/db"
        );
        assert_eq!(
            rest(
                "postgres://u@h/db?options=-c%20a%3Db&sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&application_name=x"
            ),
            "postgres://u@h/db?options=-c%20a%3Db&application_name=x"
        );
        let (_, params) =
            split("postgres://h/db?sslmode=prefer&sslrootcert=%2Ftmp%2Fca.pem&sslmode=verify-ca");
        assert_eq!(params.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(params.sslrootcert.as_deref(), Some("/tmp/ca.pem"));
    }

    fn error(url: &str) -> String {
        match from_url(url, "shown") {
            Ok(_) => panic!("{url} was taken"),
            Err(e) => match e.hint {
                Some(hint) => format!("{}\n  hint: {hint}", e.message),
                None => e.message,
            },
        }
    }

    #[test]
    fn what_is_checked_follows_libpq() {
        let check = |url: &str| {
            let (_, tls) = from_url(url, "shown").expect("taken");
            (tls.mode, tls.check)
        };
        assert_eq!(check("postgres://h/db"), (SslMode::Prefer, Check::Nothing));
        assert_eq!(
            check("postgres://h/db?sslmode=require"),
            (SslMode::Require, Check::Nothing)
        );
        assert_eq!(
            check("postgres://h/db?sslmode=disable&sslrootcert=/nowhere"),
            (SslMode::Disable, Check::Nothing)
        );
    }

    #[test]
    fn tls_parameters_that_cannot_be_used_are_refused() {
        assert_eq!(
            error("postgres://h/db?sslmode=allow"),
            "run store `shown`: `sslmode` must be one of `disable`, `prefer`, `require`, `verify-ca`, `verify-full`"
        );
        assert_eq!(
            error("postgres://h/db?sslmode=verify-full"),
            "run store `shown`: `sslmode=verify-full` needs `sslrootcert`, the certificate authorities to check the server's certificate against\n  hint: name their PEM file (`sslrootcert=/path/to/root.crt`), or `sslrootcert=system` for this machine's"
        );
        assert_eq!(
            error("postgres://h/db?sslmode=require&sslrootcert=system"),
            "run store `shown`: `sslmode=require` is too weak for `sslrootcert=system`\n  hint: use `sslmode=verify-full` (the default with `sslrootcert=system`)"
        );
        assert_eq!(
            error("postgres://h/db?sslmode=verify-ca&sslrootcert=%2Fnowhere%2Fca.pem"),
            "run store `shown`: cannot read `sslrootcert` file `/nowhere/ca.pem`: no such file"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let empty = empty.display();
        assert_eq!(
            error(&format!(
                "postgres://h/db?sslmode=verify-ca&sslrootcert={empty}"
            )),
            format!("run store `shown`: `sslrootcert` file `{empty}` holds no PEM certificate")
        );
        assert_eq!(
            error(&format!("postgres://h/db?sslmode=require&sslcert={empty}")),
            "run store `shown`: `sslcert` needs `sslkey`, the client certificate's private key"
        );
        assert_eq!(
            error(&format!(
                "postgres://h/db?sslmode=require&sslcert={empty}&sslkey={empty}"
            )),
            format!("run store `shown`: `sslcert` file `{empty}` holds no PEM certificate")
        );
    }
}
