//! Autopilot's settings (Consul's `/v1/operator/autopilot/configuration`), replicated through
//! raft so every server applies the same ones. Vigil acts on `CleanupDeadServers` and
//! `MaxTrailingLogs`; the others are kept and shown for Consul's tools.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutopilotConfig {
    /// Remove servers gossip has seen failed or left for a while (never below a quorum).
    pub cleanup_dead_servers: bool,
    /// Go duration text, as given.
    pub last_contact_threshold: String,
    /// A server further behind the leader's log than this is unhealthy.
    pub max_trailing_logs: u64,
    pub min_quorum: u64,
    /// Go duration text, as given.
    pub server_stabilization_time: String,
    pub redundancy_zone_tag: String,
    pub disable_upgrade_migration: bool,
    pub upgrade_version_tag: String,
    /// Raft indexes of the first and the latest change (0 while the defaults apply).
    pub create_index: u64,
    pub modify_index: u64,
}

impl Default for AutopilotConfig {
    /// Consul's defaults.
    fn default() -> AutopilotConfig {
        AutopilotConfig {
            cleanup_dead_servers: true,
            last_contact_threshold: "200ms".to_owned(),
            max_trailing_logs: 250,
            min_quorum: 0,
            server_stabilization_time: "10s".to_owned(),
            redundancy_zone_tag: String::new(),
            disable_upgrade_migration: false,
            upgrade_version_tag: String::new(),
            create_index: 0,
            modify_index: 0,
        }
    }
}

impl AutopilotConfig {
    /// Replaces the settings with `new` at raft `index`, unless `cas` is given and is not the
    /// current `modify_index` (Consul's check-and-set). Returns whether it replaced them.
    pub fn set(&mut self, new: AutopilotConfig, index: u64, cas: Option<u64>) -> bool {
        if cas.is_some_and(|cas| cas != self.modify_index) {
            return false;
        }
        let create_index = if self.create_index == 0 {
            index
        } else {
            self.create_index
        };
        *self = AutopilotConfig {
            create_index,
            modify_index: index,
            ..new
        };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_and_set_compares_the_modify_index() {
        let mut config = AutopilotConfig::default();
        let off = AutopilotConfig {
            cleanup_dead_servers: false,
            ..AutopilotConfig::default()
        };
        assert!(!config.set(off.clone(), 5, Some(3)));
        assert!(config.cleanup_dead_servers);
        assert!(config.set(off.clone(), 5, Some(0)));
        assert_eq!(
            (
                config.cleanup_dead_servers,
                config.create_index,
                config.modify_index
            ),
            (false, 5, 5)
        );
        assert!(config.set(AutopilotConfig::default(), 9, None));
        assert_eq!((config.create_index, config.modify_index), (5, 9));
        assert!(!config.set(off, 10, Some(5)));
    }
}
