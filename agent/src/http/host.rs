//! `GET /v1/agent/host`: the machine the agent runs on, in the shape Consul's gopsutil report
//! has (`Memory`, `CPU`, `Host`, `Disk`, `CollectionTime`, `Errors`), read from `/proc` and the
//! data filesystem; a part that cannot be read is left out and named in `Errors`.

use axum::response::Response;
use serde_json::{Map, Value, json};
use vigil_shared::acl::authz::{Access, Resource};

use super::Ctx;
use super::error::ApiError;

/// `/proc/meminfo`'s figures in bytes, by name.
fn meminfo() -> Option<Map<String, Value>> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(&format!("{name}:")))?;
        line.split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
            .map(|k| k * 1024)
    };
    let total = kib("MemTotal")?;
    let free = kib("MemFree")?;
    let available = kib("MemAvailable").unwrap_or(free);
    let used = total.saturating_sub(available);
    let mut out = Map::new();
    out.insert("total".into(), json!(total));
    out.insert("available".into(), json!(available));
    out.insert("used".into(), json!(used));
    out.insert("usedPercent".into(), json!(percent(used, total)));
    out.insert("free".into(), json!(free));
    Some(out)
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// One entry per logical CPU of `/proc/cpuinfo`.
fn cpus() -> Option<Vec<Value>> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let cpus = text
        .split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .enumerate()
        .map(|(i, block)| {
            let field = |name: &str| {
                block
                    .lines()
                    .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                    .and_then(|l| l.split_once(':'))
                    .map_or("", |(_, v)| v.trim())
                    .to_owned()
            };
            json!({
                "cpu": i,
                "vendorId": field("vendor_id"),
                "modelName": field("model name"),
                "cores": 1,
                "mhz": field("cpu MHz").parse::<f64>().unwrap_or(0.0),
            })
        })
        .collect();
    Some(cpus)
}

fn host(hostname: &str) -> Option<Value> {
    let proc_file = |path: &str| std::fs::read_to_string(path).map(|s| s.trim().to_owned());
    let uptime = proc_file("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse::<f64>()
        .ok()? as u64;
    let boot_time = proc_file("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())?;
    let procs = std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
                .count()
        })
        .unwrap_or(0);
    Some(json!({
        "hostname": hostname,
        "uptime": uptime,
        "bootTime": boot_time,
        "procs": procs,
        "os": std::env::consts::OS,
        "kernelVersion": proc_file("/proc/sys/kernel/osrelease").unwrap_or_default(),
        "kernelArch": std::env::consts::ARCH,
    }))
}

/// The filesystem of the working directory (the data directory's, for a server).
fn disk() -> Option<Value> {
    let stat = nix::sys::statvfs::statvfs(".").ok()?;
    let block = stat.fragment_size();
    let total = stat.blocks() * block;
    let free = stat.blocks_available() * block;
    let used = total.saturating_sub(stat.blocks_free() * block);
    Some(json!({
        "path": std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default(),
        "total": total,
        "free": free,
        "used": used,
        "usedPercent": percent(used, total),
    }))
}

/// `GET /v1/agent/host` (`operator:read`, as in Consul).
pub async fn host_info(cx: Ctx) -> Result<Response, ApiError> {
    cx.check(Resource::Operator, Access::Read, "")?;
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let mut errors = Vec::new();
    let mut part = |name: &str, value: Option<Value>| {
        value.unwrap_or_else(|| {
            errors.push(format!("{name}: not readable on this system"));
            Value::Null
        })
    };
    let memory = part("memory", meminfo().map(Value::Object));
    let cpu = part("cpu", cpus().map(Value::Array));
    let host = part("host", host(&hostname));
    let disk = part("disk", disk());
    let collected = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    Ok(cx.json(&json!({
        "Memory": memory,
        "CPU": cpu,
        "Host": host,
        "Disk": disk,
        "CollectionTime": collected,
        "Errors": if errors.is_empty() { Value::Null } else { json!(errors) },
    })))
}
