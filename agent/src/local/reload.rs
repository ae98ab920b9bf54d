//! `PUT /v1/agent/reload`: re-reads the config file and brings the agent's config-file services
//! and checks in line with it. Services and checks registered over HTTP are left alone; a
//! config-file one no longer declared is removed. A file that does not parse changes nothing.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{LocalError, LocalState, Source};
use crate::config::{Config, ConfigError, LocalDefinitions};

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("Failed reloading config: {0}")]
    Config(#[from] ConfigError),
    #[error("Failed reloading services: {0}")]
    Local(#[from] LocalError),
}

/// The config file and what was last loaded from it.
pub struct Reloader {
    path: Option<PathBuf>,
    loaded: Mutex<LocalDefinitions>,
}

impl Reloader {
    /// `loaded` is what the agent registered from `path` at start.
    pub fn new(path: Option<PathBuf>, loaded: LocalDefinitions) -> Reloader {
        Reloader {
            path,
            loaded: Mutex::new(loaded),
        }
    }

    /// Re-reads the file and applies its services and checks to `local`. An agent started
    /// without a config file has nothing to reload.
    pub fn reload(&self, local: &Arc<LocalState>) -> Result<(), ReloadError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let new = Config::file_definitions(path)?;
        let mut loaded = self.loaded.lock();
        for gone in loaded
            .services
            .iter()
            .filter(|s| !new.services.iter().any(|n| n.service.id == s.service.id))
        {
            ignore_unknown(local.remove_service(&gone.service.id))?;
        }
        for gone in loaded
            .checks
            .iter()
            .filter(|c| !new.checks.iter().any(|n| n.id == c.id))
        {
            ignore_unknown(local.remove_check(&gone.id))?;
        }
        for service in new.services.iter().cloned() {
            local.add_service(service, false, Source::Config)?;
        }
        for check in new.checks.iter().cloned() {
            local.add_check(check, Source::Config)?;
        }
        tracing::info!(
            services = new.services.len(),
            checks = new.checks.len(),
            path = %path.display(),
            "reloaded the config file"
        );
        *loaded = new;
        Ok(())
    }
}

/// A config-file service or check already removed over HTTP is not an error.
fn ignore_unknown(result: Result<(), LocalError>) -> Result<(), LocalError> {
    match result {
        Err(LocalError::UnknownService(_) | LocalError::UnknownCheck(_)) => Ok(()),
        other => other,
    }
}
