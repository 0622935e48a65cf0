//! The OpenAPI document of the API, generated from the handlers and their types: served at
//! `/api/v1/openapi.json`, printed by `archon serve --openapi`, checked in as `schemas/openapi.json`.

use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Archon",
        description = "The HTTP API of `archon serve`: workflows, runs, their events and logs, approvals, \
                       and the actions an operator takes. Send `Authorization: Bearer TOKEN`; a viewer's \
                       token reads, an operator's also changes. docs/serve.md says more.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "session", description = "Who is calling"),
        (name = "workflows", description = "The served workflows, and starting runs"),
        (name = "runs", description = "Stored runs: listing, detail, events, logs, live streams, actions"),
        (name = "approvals", description = "Calls waiting for a person's decision"),
        (name = "triggers", description = "The workflows' cron and webhook triggers, and their firings"),
    ),
    components(schemas(super::app::ApiError)),
    modifiers(&Security),
)]
struct ApiDoc;

/// The bearer-token scheme, required by every operation.
struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
        };
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        openapi.security = Some(vec![SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
    }
}

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .nest("/api/v1", super::api::openapi_router())
        .into_openapi();
    doc.info.version = "1".to_owned();
    doc.servers = None;
    doc
}

/// The document as indented JSON, ending in a newline: what `schemas/openapi.json` holds.
pub fn document_text() -> String {
    let mut text = document()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}
