//! `archon version [--json]`: the version, and what a bug report needs to say about this build.

use archon_engine::record::FORMAT_VERSION;
use archon_engine::session::{POSTGRES_STORE_SCHEMA_VERSION, STORE_SCHEMA_VERSION};

use super::Status;
use crate::args::VersionArgs;
use crate::output;

/// This build, as a bug report describes it.
#[derive(Debug, serde::Serialize)]
struct Build {
    version: &'static str,
    /// The SQLite run store's schema version this build writes (`PRAGMA user_version`).
    store_schema: usize,
    /// The PostgreSQL run store's schema version this build writes (`archon_schema_version`). Known to
    /// the build: `version` connects to no store.
    postgres_store_schema: usize,
    /// The format version of the records the store keeps.
    record_format: u32,
    /// The target triple it was compiled for.
    target: &'static str,
    /// `debug` or `release`.
    profile: &'static str,
    /// The compiler that built it.
    rustc: &'static str,
}

pub fn version(args: &VersionArgs) -> anyhow::Result<Status> {
    let build = Build {
        version: env!("CARGO_PKG_VERSION"),
        store_schema: STORE_SCHEMA_VERSION,
        postgres_store_schema: POSTGRES_STORE_SCHEMA_VERSION,
        record_format: FORMAT_VERSION,
        target: env!("ARCHON_TARGET"),
        profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        rustc: env!("ARCHON_RUSTC"),
    };
    if args.json {
        output::stdout_json(&build);
        return Ok(Status::Success);
    }
    output::stdout(&format!(
        "archon {}\nstore schema   {} (SQLite), {} (PostgreSQL)\nrecord format  {}\ntarget         {}\nprofile        {}\nrustc          {}\n",
        build.version,
        build.store_schema,
        build.postgres_store_schema,
        build.record_format,
        build.target,
        build.profile,
        // `rustc 1.95.0 (...)`: the label says it is rustc.
        build.rustc.strip_prefix("rustc ").unwrap_or(build.rustc)
    ));
    Ok(Status::Success)
}
