//! Binding a session to the process that holds it: the local agent follows this process with a
//! `ProcessID` check (critical the moment the process exits), carried by a service of its own
//! so a dead process's check never turns the whole node critical, and reaped a minute after the
//! process is gone. Only an agent on this host can follow this process: for any other agent
//! address nothing is registered.

use std::net::IpAddr;

use reqwest::Method;
use serde_json::json;

use super::{Client, ClientError, REQUEST_TIMEOUT, encode_path};

/// The service that carries this process's check, by process ID.
fn service_id(pid: u32) -> String {
    format!("vigil-process-{pid}")
}

/// Whether `base` (`http://host:port`) names this host.
pub(crate) fn is_local(base: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(base) else {
        return false;
    };
    let Some(host) = url.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => bare.eq_ignore_ascii_case("localhost"),
    }
}

impl Client {
    /// The ID of the check that follows this process on the agent, registering it (once per
    /// process) if needed; `None` when the agent is not on this host. Bind a session to it
    /// with `ServiceChecks`.
    pub async fn process_check(&self) -> Result<Option<String>, ClientError> {
        if !is_local(self.base()) {
            return Ok(None);
        }
        let pid = std::process::id();
        let id = service_id(pid);
        let check = format!("service:{id}");
        let path = format!("/v1/agent/service/{}", encode_path(&id));
        let known = self.send(Method::GET, &path, None, REQUEST_TIMEOUT).await?;
        if known.status == 200 {
            return Ok(Some(check));
        }
        let body = json!({
            "ID": id,
            "Name": "vigil-process",
            "Meta": {"pid": pid.to_string()},
            "Check": {"ProcessID": pid, "DeregisterCriticalServiceAfter": "1m"},
        });
        self.send(
            Method::PUT,
            "/v1/agent/service/register",
            Some(body.to_string().into_bytes()),
            REQUEST_TIMEOUT,
        )
        .await?
        .ok()?;
        Ok(Some(check))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_loopback_agent_is_local() {
        for base in [
            "http://127.0.0.1:8500",
            "http://localhost:8500",
            "http://[::1]:8500",
        ] {
            assert!(is_local(base), "{base}");
        }
        for base in [
            "http://10.0.0.5:8500",
            "http://consul.service:8500",
            "not a url",
        ] {
            assert!(!is_local(base), "{base}");
        }
    }
}
