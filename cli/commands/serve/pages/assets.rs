//! The dashboard's stylesheet, script and icon, embedded in the binary and served under a name that holds a
//! hash of their content (`/assets/app.3f2a9c1e0b7d.css`): a browser may keep them for good, and a new
//! build's pages name new files.

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

/// One embedded file.
#[derive(Debug)]
pub struct Asset {
    /// `app.HASH.css`.
    name: String,
    content_type: &'static str,
    body: &'static str,
}

impl Asset {
    fn new(stem: &str, extension: &str, content_type: &'static str, body: &'static str) -> Asset {
        let hash = Sha256::digest(body.as_bytes());
        let short: String = hash.iter().take(6).map(|b| format!("{b:02x}")).collect();
        Asset {
            name: format!("{stem}.{short}.{extension}"),
            content_type,
            body,
        }
    }

    /// Where pages link it.
    pub fn url(&self) -> String {
        format!("/assets/{}", self.name)
    }
}

pub static CSS: LazyLock<Asset> = LazyLock::new(|| {
    Asset::new(
        "app",
        "css",
        "text/css; charset=utf-8",
        include_str!("assets/app.css"),
    )
});

pub static JS: LazyLock<Asset> = LazyLock::new(|| {
    Asset::new(
        "app",
        "js",
        "text/javascript; charset=utf-8",
        include_str!("assets/app.js"),
    )
});

pub static ICON: LazyLock<Asset> = LazyLock::new(|| {
    Asset::new(
        "icon",
        "svg",
        "image/svg+xml",
        include_str!("assets/icon.svg"),
    )
});

/// `GET /assets/{file}`: the file of this build by its hashed name, cached for a year; any other name
/// is `404`.
pub async fn serve(Path(file): Path<String>) -> Response {
    for asset in [&*CSS, &*JS, &*ICON] {
        if asset.name == file {
            let mut response = asset.body.into_response();
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            );
            headers.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=31536000, immutable"),
            );
            return response;
        }
    }
    (StatusCode::NOT_FOUND, "no such asset in this build").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_change_with_the_content() {
        let a = Asset::new("app", "css", "text/css", "a{}");
        let b = Asset::new("app", "css", "text/css", "b{}");
        assert_ne!(a.url(), b.url());
        assert!(a.url().starts_with("/assets/app."), "{}", a.url());
        assert_eq!(a.url().len(), "/assets/app.0123456789ab.css".len());
    }
}
