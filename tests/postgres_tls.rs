//! TLS to the PostgreSQL run store, with libpq's `sslmode` and `sslrootcert`, through the real binary. The
//! tests do not depend on how the machine's server is set up: each starts a TLS-terminating proxy of its own
//! in front of it (it answers the client's SSLRequest with `S`, makes the TLS handshake with a certificate
//! the test made, then passes the plain PostgreSQL protocol on to the server) and counts the connections
//! that were encrypted, and those that came in plain. PostgreSQL as in `postgres.rs`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::Value as Json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::postgres::{Db, db};
use crate::support::{Output, archon_with};

/// The first message of a client that asks for TLS: its length (8) and the code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// A certificate authority the test made.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("key");
        Ca {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    /// Its certificate in file `name` of `dir`; the file's path.
    fn write(&self, dir: &std::path::Path, name: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, self.issuer.pem()).expect("write the CA");
        path.display().to_string()
    }

    /// A server's certificate for `names` (host names or IP addresses), signed by this authority, and its
    /// key.
    fn server(&self, names: &[&str]) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        self.signed(names)
    }

    /// A certificate (a server's or a client's) for `names`, signed by this authority, and its key.
    fn signed(&self, names: &[&str]) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = KeyPair::generate().expect("key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .expect("params");
        params.distinguished_name.push(DnType::CommonName, names[0]);
        let cert = params.signed_by(&key, &*self.issuer).expect("signed");
        (
            vec![cert.der().clone(), self.issuer.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
    }
}

/// What the proxy saw.
#[derive(Default)]
struct Seen {
    /// Connections whose TLS handshake completed (the client accepted the certificate).
    tls: AtomicUsize,
    /// Handshakes that failed (the client refused the certificate, say).
    failed: AtomicUsize,
    /// Connections that asked for TLS and were told the server has none (`N`).
    declined: AtomicUsize,
    /// Connections that did not ask for TLS (their first message was not an SSLRequest).
    plain: AtomicUsize,
}

impl Seen {
    fn counts(&self) -> (usize, usize, usize, usize) {
        (
            self.tls.load(Ordering::SeqCst),
            self.failed.load(Ordering::SeqCst),
            self.declined.load(Ordering::SeqCst),
            self.plain.load(Ordering::SeqCst),
        )
    }
}

/// A proxy in front of the test's server on 127.0.0.1: with a certificate, it speaks only TLS (a client
/// that does not ask for it is cut off); without, it declines TLS and passes plain connections on.
struct Proxy {
    addr: SocketAddr,
    seen: Arc<Seen>,
    _runtime: tokio::runtime::Runtime,
}

impl Proxy {
    fn start(
        upstream: String,
        certificate: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    ) -> Proxy {
        Proxy::start_with(upstream, certificate, None)
    }

    /// With `clients`, the proxy also wants a client certificate signed by that authority.
    fn start_with(
        upstream: String,
        certificate: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
        clients: Option<CertificateDer<'static>>,
    ) -> Proxy {
        let acceptor = certificate.map(|(chain, key)| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("protocol versions");
            let builder = match clients {
                Some(ca) => {
                    let mut roots = rustls::RootCertStore::empty();
                    roots.add(ca).expect("client CA");
                    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                        Arc::new(roots),
                        provider,
                    )
                    .build()
                    .expect("client verifier");
                    builder.with_client_cert_verifier(verifier)
                }
                None => builder.with_no_client_auth(),
            };
            let config = builder.with_single_cert(chain, key).expect("server config");
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let seen = Arc::new(Seen::default());
        let counts = seen.clone();
        runtime.spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(
                    socket,
                    upstream.clone(),
                    acceptor.clone(),
                    counts.clone(),
                ));
            }
        });
        Proxy {
            addr,
            seen,
            _runtime: runtime,
        }
    }
}

/// One client connection.
async fn serve(
    mut socket: tokio::net::TcpStream,
    upstream: String,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    seen: Arc<Seen>,
) {
    let mut first = [0u8; 8];
    if socket.read_exact(&mut first).await.is_err() {
        return;
    }
    if first != SSL_REQUEST {
        // A startup message, in the clear: refused as a server that requires TLS refuses it (the rest of
        // the message read first, so that the client hears the answer, not a reset).
        seen.plain.fetch_add(1, Ordering::SeqCst);
        let length = u32::from_be_bytes([first[0], first[1], first[2], first[3]]) as usize;
        let mut rest = vec![0u8; length.saturating_sub(8).min(10_000)];
        if socket.read_exact(&mut rest).await.is_err() {
            return;
        }
        let mut fields = Vec::new();
        for (code, value) in [
            (b'S', "FATAL"),
            (b'V', "FATAL"),
            (b'C', "28000"),
            (b'M', "The proxy accepts only TLS connections"),
        ] {
            fields.push(code);
            fields.extend_from_slice(value.as_bytes());
            fields.push(0);
        }
        fields.push(0);
        let mut error = vec![b'E'];
        error.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
        error.extend_from_slice(&fields);
        let _ = socket.write_all(&error).await;
        let _ = socket.shutdown().await;
        return;
    }
    let Some(acceptor) = acceptor else {
        seen.declined.fetch_add(1, Ordering::SeqCst);
        if socket.write_all(b"N").await.is_err() {
            return;
        }
        if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
            let _ = tokio::io::copy_bidirectional(&mut socket, &mut server).await;
        }
        return;
    };
    if socket.write_all(b"S").await.is_err() {
        return;
    }
    match acceptor.accept(socket).await {
        Ok(mut tls) => {
            seen.tls.fetch_add(1, Ordering::SeqCst);
            if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
            }
        }
        Err(_) => {
            seen.failed.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The certificate authority the tests trust, and the file it is written to in the test's directory.
fn authority(db: &Db) -> (Ca, String) {
    let ca = Ca::new("archon test ca");
    let file = ca.write(db.path(), "ca.pem");
    (ca, file)
}

/// The test's database URL, for a proxy to pass connections on to.
fn upstream(db: &Db) -> String {
    db.url_through("127.0.0.1:1".parse().expect("address")).0
}

/// The test's URL through `proxy`, by `host` (`127.0.0.1` or `localhost`), with `params` added.
fn through(db: &Db, proxy: &Proxy, host: &str, params: &str) -> (String, String) {
    let (server, url) = db.url_through(proxy.addr);
    let url = url.replacen(
        &proxy.addr.to_string(),
        &format!("{host}:{}", proxy.addr.port()),
        1,
    );
    (server, format!("{url}&{params}"))
}

const HELLO: &str = r#"name: hello
steps:
  - id: greet
    tool: exec
    with: { argv: [sh, -c, "echo hello over tls"] }
outputs:
  greeting: "{{ steps.greet.output }}"
"#;

/// `archon runs --json` with `--store url`: the runs' workflows and states, or the failure.
fn runs(db: &Db, url: &str) -> Result<Vec<(String, String)>, (i32, String)> {
    let Output {
        code,
        stdout,
        stderr,
    } = archon_with(db.path(), &["runs", "--json", "--store", url], &[]);
    if code != 0 {
        return Err((code, stderr));
    }
    let Json::Array(runs) = serde_json::from_str(&stdout).expect("runs as JSON") else {
        panic!("not a list: {stdout}");
    };
    Ok(runs
        .iter()
        .map(|r| {
            (
                r["workflow"].as_str().unwrap_or_default().to_owned(),
                r["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect())
}

/// The error `archon runs --store url` ends with.
fn refused(db: &Db, url: &str) -> String {
    match runs(db, url) {
        Ok(runs) => panic!("`{url}` was taken: {runs:?}"),
        Err((code, stderr)) => {
            assert_eq!(code, 1, "{stderr}");
            stderr
        }
    }
}

fn shown(url: &str) -> String {
    archon_engine::store::postgres::masked(url)
}

#[test]
fn require_encrypts_and_verify_full_checks_the_chain_and_the_name() {
    let Some(db) = db() else { return };
    let (ca, ca_file) = authority(&db);
    let proxy = Proxy::start(upstream(&db), Some(ca.server(&["localhost", "127.0.0.1"])));
    std::fs::write(db.path().join("hello.yaml"), HELLO).expect("write");

    // The default, `prefer`: TLS, as the server offers it, the certificate taken as it is (nothing says
    // which authority to trust). Every connection of the run, the pool's and the one that listens for
    // cancels, asks for TLS: one that did not would come in plain.
    let (_, url) = through(&db, &proxy, "127.0.0.1", "application_name=archon-test");
    let Output { code, stderr, .. } = archon_with(
        db.path(),
        &["run", "hello.yaml", "--json", "--store", &url],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    let (tls, failed, declined, plain) = proxy.seen.counts();
    assert!(tls >= 2, "{tls} encrypted connections");
    assert_eq!((failed, declined, plain), (0, 0, 0));
    // `require`: the same, or nothing.
    let (_, url) = through(&db, &proxy, "127.0.0.1", "sslmode=require");
    assert_eq!(
        runs(&db, &url),
        Ok(vec![("hello".to_owned(), "succeeded".to_owned())])
    );
    let (more, failed, declined, plain) = proxy.seen.counts();
    assert!(more > tls, "{more} encrypted connections");
    assert_eq!((failed, declined, plain), (0, 0, 0));

    // `verify-full` with the test's authority: by name, and by address (the certificate names both).
    for host in ["localhost", "127.0.0.1"] {
        let (_, url) = through(
            &db,
            &proxy,
            host,
            &format!("sslmode=verify-full&sslrootcert={ca_file}"),
        );
        assert_eq!(
            runs(&db, &url),
            Ok(vec![("hello".to_owned(), "succeeded".to_owned())]),
            "{host}"
        );
    }
    // `require` with `sslrootcert` checks the chain, as libpq does.
    let other_ca = Ca::new("another ca").write(db.path(), "other.pem");
    let (_, url) = through(
        &db,
        &proxy,
        "localhost",
        &format!("sslmode=require&sslrootcert={other_ca}"),
    );
    let before = proxy.seen.counts().1;
    assert_eq!(
        refused(&db, &url),
        format!(
            "error: run store `{}`: tls handshake failed: the server's certificate is not signed by a certificate authority of `sslrootcert`\n  hint: `sslrootcert` names the certificate authorities to trust: a PEM file, or `system` for this machine's\n",
            shown(&url)
        )
    );
    // An authority that did not sign the server's certificate.
    let (_, url) = through(
        &db,
        &proxy,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={other_ca}"),
    );
    assert_eq!(
        refused(&db, &url),
        format!(
            "error: run store `{}`: tls handshake failed: the server's certificate is not signed by a certificate authority of `sslrootcert`\n  hint: `sslrootcert` names the certificate authorities to trust: a PEM file, or `system` for this machine's\n",
            shown(&url)
        )
    );
    assert!(proxy.seen.counts().1 > before, "the handshakes failed");
    assert_eq!(proxy.seen.counts().3, 0, "nothing came in plain");
}

#[test]
fn verify_ca_checks_the_chain_but_not_the_name() {
    let Some(db) = db() else { return };
    let (ca, ca_file) = authority(&db);
    // A certificate from the right authority, made out to another host.
    let proxy = Proxy::start(upstream(&db), Some(ca.server(&["db.example"])));
    let (_, url) = through(
        &db,
        &proxy,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca_file}"),
    );
    assert_eq!(
        refused(&db, &url),
        format!(
            "error: run store `{}`: tls handshake failed: the server's certificate is not made out to `localhost`\n  hint: connect by a name the certificate is made out to, or check its chain only with `sslmode=verify-ca`\n",
            shown(&url)
        )
    );
    assert_eq!(proxy.seen.counts().0, 0, "no handshake completed");
    let (_, url) = through(
        &db,
        &proxy,
        "localhost",
        &format!("sslmode=verify-ca&sslrootcert={ca_file}"),
    );
    assert_eq!(runs(&db, &url), Ok(vec![]));
    let (tls, _, declined, plain) = proxy.seen.counts();
    assert!(tls >= 1, "{tls} encrypted connections");
    assert_eq!((declined, plain), (0, 0));
    // `verify-ca` still wants the right authority.
    let other_ca = Ca::new("another ca").write(db.path(), "other.pem");
    let (_, url) = through(
        &db,
        &proxy,
        "localhost",
        &format!("sslmode=verify-ca&sslrootcert={other_ca}"),
    );
    assert_eq!(
        refused(&db, &url),
        format!(
            "error: run store `{}`: tls handshake failed: the server's certificate is not signed by a certificate authority of `sslrootcert`\n  hint: `sslrootcert` names the certificate authorities to trust: a PEM file, or `system` for this machine's\n",
            shown(&url)
        )
    );
}

#[test]
fn disable_never_asks_for_tls_and_prefer_does_without_it_when_the_server_has_none() {
    let Some(db) = db() else { return };
    let ca = Ca::new("archon test ca");
    let upstream = upstream(&db);
    let tls_only = Proxy::start(upstream.clone(), Some(ca.server(&["localhost"])));
    // `disable` talks plain PostgreSQL to a server that requires TLS: it is refused.
    let (_, url) = through(&db, &tls_only, "127.0.0.1", "sslmode=disable");
    assert_eq!(
        refused(&db, &url),
        format!(
            "error: run store `{}`: the proxy accepts only TLS connections\n",
            shown(&url)
        )
    );
    let (tls, failed, declined, plain) = tls_only.seen.counts();
    assert_eq!((tls, failed, declined), (0, 0, 0));
    assert!(plain >= 1, "{plain} plain connections");
    // Straight to the server, `disable` works.
    assert_eq!(
        runs(&db, &format!("{}&sslmode=disable", db.url())),
        Ok(vec![])
    );

    let no_tls = Proxy::start(upstream, None);
    // The default (`prefer`) and `prefer` ask, are told no, and go on without TLS.
    for params in ["application_name=archon-test", "sslmode=prefer"] {
        let (_, url) = through(&db, &no_tls, "127.0.0.1", params);
        assert_eq!(runs(&db, &url), Ok(vec![]), "{params}");
    }
    let (tls, failed, declined, plain) = no_tls.seen.counts();
    assert_eq!((tls, failed, plain), (0, 0, 0));
    assert!(declined >= 2, "{declined} declined");
    // `require` does not.
    let (_, url) = through(&db, &no_tls, "127.0.0.1", "sslmode=require");
    assert_eq!(
        refused(&db, &url),
        format!(
            "error: run store `{}`: the server does not accept tls connections, which `sslmode=require` requires\n  hint: turn `ssl` on in the server's configuration, or connect without tls with `sslmode=prefer` or `disable`\n",
            shown(&url)
        )
    );
}

/// As libpq, no TLS over a Unix-domain socket, whatever `sslmode` says (the server speaks none there, and
/// only processes of its host reach it): a socket URL connects with each mode, and a run goes through it.
#[test]
fn a_unix_socket_connects_without_tls_whatever_the_sslmode() {
    let Some(db) = db() else { return };
    let Some(url) = db.url_at_socket() else {
        return;
    };
    for params in [
        "application_name=archon-test",
        "sslmode=prefer",
        "sslmode=require",
        "sslmode=disable",
    ] {
        assert_eq!(
            runs(&db, &format!("{url}&{params}")),
            Ok(vec![]),
            "{params}"
        );
    }
    std::fs::write(db.path().join("hello.yaml"), HELLO).expect("write");
    let Output { code, stderr, .. } = archon_with(
        db.path(),
        &["run", "--store", &url, "hello.yaml"],
        &[("NO_COLOR", "1")],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        runs(&db, &url),
        Ok(vec![("hello".to_owned(), "succeeded".to_owned())])
    );
}

#[test]
fn tls_parameters_that_cannot_be_used_are_refused_before_connecting() {
    let dir = tempfile::TempDir::new().expect("tempdir");
    let refused = |url: &str| {
        let Output {
            code,
            stdout,
            stderr,
        } = archon_with(dir.path(), &["runs", "--store", url], &[]);
        assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
        stderr
    };
    // Nothing listens on port 1: these fail before any connection is tried.
    assert_eq!(
        refused("postgres://ann:s3cret@127.0.0.1:1/db?sslmode=bogus"),
        "error: run store `postgres://ann:***@127.0.0.1:1/db?sslmode=bogus`: `sslmode` must be one of `disable`, `prefer`, `require`, `verify-ca`, `verify-full`\n"
    );
    assert_eq!(
        refused(
            "postgres://ann:s3cret@127.0.0.1:1/db?sslmode=verify-full&sslrootcert=/nowhere/ca.pem"
        ),
        "error: run store `postgres://ann:***@127.0.0.1:1/db?sslmode=verify-full&sslrootcert=/nowhere/ca.pem`: cannot read `sslrootcert` file `/nowhere/ca.pem`: no such file\n"
    );
    assert_eq!(
        refused("postgres://ann:s3cret@127.0.0.1:1/db?sslmode=verify-ca"),
        "error: run store `postgres://ann:***@127.0.0.1:1/db?sslmode=verify-ca`: `sslmode=verify-ca` needs `sslrootcert`, the certificate authorities to check the server's certificate against\n  hint: name their PEM file (`sslrootcert=/path/to/root.crt`), or `sslrootcert=system` for this machine's\n"
    );
    assert_eq!(
        refused("postgres://ann:s3cret@127.0.0.1:1/db?sslmode=require&sslrootcert=system"),
        "error: run store `postgres://ann:***@127.0.0.1:1/db?sslmode=require&sslrootcert=system`: `sslmode=require` is too weak for `sslrootcert=system`\n  hint: use `sslmode=verify-full` (the default with `sslrootcert=system`)\n"
    );
}

#[test]
fn workers_listen_for_work_over_tls_too() {
    let Some(db) = db() else { return };
    let (ca, ca_file) = authority(&db);
    let proxy = Proxy::start(upstream(&db), Some(ca.server(&["localhost"])));
    std::fs::write(db.path().join("hello.yaml"), HELLO).expect("write");
    // `prefer` (with `sslrootcert`, the chain is checked): a connection that did not ask for TLS would
    // come in plain, where with `require` or `verify-*` it would fail unseen (and the worker poll instead).
    let (_, url) = through(
        &db,
        &proxy,
        "localhost",
        &format!("sslmode=prefer&sslrootcert={ca_file}"),
    );
    let worker = crate::workers::worker_with(&db, 0, &url, &[]);
    worker.wait_ready();
    // Submitted straight to the server; the worker hears of it through its listening connection.
    let id = crate::workers::submit(&db, "hello.yaml");
    let run = crate::workers::ended(&db, &id);
    assert_eq!(run["status"], "succeeded", "{run}");
    crate::workers::stop(vec![worker]);
    let (tls, failed, declined, plain) = proxy.seen.counts();
    // The pool's connection(s) and the listener's: every one encrypted.
    assert!(tls >= 2, "{tls} encrypted connections");
    assert_eq!((failed, declined, plain), (0, 0, 0));
}

#[test]
fn a_client_certificate_is_presented_from_sslcert_and_sslkey() {
    let Some(db) = db() else { return };
    let (ca, ca_file) = authority(&db);
    let proxy = Proxy::start_with(
        upstream(&db),
        Some(ca.server(&["localhost"])),
        Some(ca.issuer.der().clone()),
    );
    let (chain, key) = ca.signed(&["archon"]);
    let PrivateKeyDer::Pkcs8(key) = key else {
        panic!("a PKCS#8 key")
    };
    let pem = |label: &str, der: &[u8]| {
        use base64::Engine;
        let text = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = text
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).expect("base64"))
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    };
    let cert_file = db.path().join("client.crt");
    std::fs::write(&cert_file, pem("CERTIFICATE", &chain[0])).expect("write");
    let key_file = db.path().join("client.key");
    std::fs::write(&key_file, pem("PRIVATE KEY", key.secret_pkcs8_der())).expect("write");
    let (_, url) = through(
        &db,
        &proxy,
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={ca_file}&sslcert={}&sslkey={}",
            cert_file.display(),
            key_file.display()
        ),
    );
    assert_eq!(runs(&db, &url), Ok(vec![]));
    let (tls, failed, _, plain) = proxy.seen.counts();
    assert!(tls >= 1, "{tls} encrypted connections");
    assert_eq!((failed, plain), (0, 0));
    // Without one, the server refuses the handshake.
    let (_, url) = through(
        &db,
        &proxy,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca_file}"),
    );
    assert_eq!(
        refused(&db, &url),
        format!(
            "error: run store `{}`: tls handshake failed: the server wants a client certificate\n  hint: give one, and its key, as PEM files with `sslcert` and `sslkey`\n",
            shown(&url)
        )
    );
    assert!(proxy.seen.counts().1 >= 1, "the handshake failed");
}
