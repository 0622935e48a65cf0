//! Which project skill directories (`.agents/skills/` beside a spec) are trusted: the user's config file,
//! `$XDG_CONFIG_HOME/archon/config.toml` (default `~/.config/archon/config.toml`), lists them:
//!
//! ```toml
//! [skills]
//! trusted = ["/home/me/src/app/.agents/skills"]
//! ```
//!
//! A project skill the spec does not name is used only from a trusted directory: a repository cloned
//! from elsewhere cannot give its agents instructions by dropping files there.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Largest config file read.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// The trusted project skill directories, canonical.
#[derive(Clone, Debug, Default)]
pub struct Trust {
    dirs: Vec<PathBuf>,
}

/// The user's config file, as far as skills go.
#[derive(Debug, Default, Deserialize)]
struct Config {
    #[serde(default)]
    skills: SkillsConfig,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SkillsConfig {
    #[serde(default)]
    trusted: Vec<PathBuf>,
}

/// Why the config file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("cannot read `{path}`: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("`{path}` is not a valid config file: {reason}")]
    Parse { path: PathBuf, reason: String },
}

impl Trust {
    /// Trusts exactly `dirs` (canonicalized where they exist).
    pub fn new(dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        Trust {
            dirs: dirs
                .into_iter()
                .map(|d| std::fs::canonicalize(&d).unwrap_or(d))
                .collect(),
        }
    }

    /// Where the user's config file is: `$XDG_CONFIG_HOME/archon/config.toml`, else
    /// `$HOME/.config/archon/config.toml`.
    pub fn config_path() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|h| PathBuf::from(h).join(".config"))
            })?;
        Some(base.join("archon").join("config.toml"))
    }

    /// The trust the user's config file gives; none when there is no such file.
    pub fn from_config() -> Result<Self, TrustError> {
        match Self::config_path() {
            Some(path) if path.exists() => Self::read(&path),
            _ => Ok(Trust::default()),
        }
    }

    /// The trust the config file at `path` gives.
    pub fn read(path: &Path) -> Result<Self, TrustError> {
        let bytes =
            crate::source::read_bounded(path, MAX_CONFIG_BYTES).map_err(|e| TrustError::Read {
                path: path.to_path_buf(),
                reason: e.reason(),
            })?;
        let text = String::from_utf8(bytes).map_err(|_| TrustError::Read {
            path: path.to_path_buf(),
            reason: "it is not valid UTF-8".to_owned(),
        })?;
        let config: Config = toml::from_str(&text).map_err(|e| TrustError::Parse {
            path: path.to_path_buf(),
            reason: e.message().to_owned(),
        })?;
        Ok(Trust::new(config.skills.trusted))
    }

    /// Whether the directory `dir` is trusted.
    pub fn trusts(&self, dir: &Path) -> bool {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        self.dirs.contains(&dir)
    }
}
