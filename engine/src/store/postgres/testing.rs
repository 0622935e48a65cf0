//! What the store's own tests against the real server share: a store on a schema of its own.

use super::PostgresStore;

/// The test database: `$ARCHON_TEST_POSTGRES`, else the local server's `test` database.
pub(super) fn base() -> String {
    std::env::var("ARCHON_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Runs `sql` on a connection of its own.
pub(super) async fn admin(sql: &str) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(&base(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    client.batch_execute(sql).await
}

/// A connection of its own to `schema` (without the store's settings: the server does not end it while
/// it idles in a transaction).
pub(super) async fn connect(schema: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&base(), tokio_postgres::NoTls)
        .await
        .expect("a connection of its own");
    tokio::spawn(connection);
    client
        .batch_execute(&format!("SET search_path TO {schema}"))
        .await
        .expect("its schema");
    client
}

/// A store on a schema of its own in the test database, and the schema's name; `None` after saying why
/// when PostgreSQL cannot be reached (a failure with `CI=true`).
pub(super) fn store() -> Option<(PostgresStore, String)> {
    let base = base();
    let schema = format!(
        "archon_unit_{}_{:08x}",
        std::process::id(),
        fastrand::u32(..)
    );
    let made = super::runtime()
        .ok()?
        .block_on(admin(&format!("CREATE SCHEMA {schema}")));
    if let Err(e) = made {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "PostgreSQL cannot be reached (required with CI=true): {e}"
        );
        #[allow(clippy::print_stderr)]
        {
            eprintln!("skipped: PostgreSQL cannot be reached: {e}");
        }
        return None;
    }
    let glue = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{glue}options=-c%20search_path%3D{schema}");
    Some((
        PostgresStore::open(&url, None).expect("store opened"),
        schema,
    ))
}

/// Drops a schema [`store`] made.
pub(super) fn drop_schema(schema: &str) {
    if let Ok(runtime) = super::runtime() {
        let _ = runtime.block_on(admin(&format!("DROP SCHEMA {schema} CASCADE")));
    }
}
