"""Operates a Vigil dev agent with py-consul, unchanged: metrics, snapshot save and restore,
the raft configuration, autopilot, reload and the gossip keyring.

Usage: consul_operate.py HOST PORT GOSSIP_KEY NEW_KEY (the agent runs with --encrypt GOSSIP_KEY).
Exits non-zero on the first failed check.
"""

import sys

import consul
from checks import check, passed

def main(host, port, key, new_key):
    c = consul.Consul(host=host, port=int(port))

    # Metrics, as JSON and as Prometheus text.
    metrics = c.agent.metrics()
    for field in ("Timestamp", "Gauges", "Points", "Counters", "Samples"):
        check(field in metrics, f"metrics field {field} in {sorted(metrics)}")
    text = c.agent.metrics(format_prometheus=True)
    check("# TYPE" in str(text), "prometheus text")

    # A snapshot brings a value back.
    check(c.kv.put("py/operate", "before"), "put before")
    archive = c.snapshot.save()
    check(isinstance(archive, bytes) and archive[:2] == b"\x1f\x8b", "a gzip archive")
    check(c.kv.put("py/operate", "after"), "put after")
    check(c.snapshot.restore(archive), "restore")
    _, entry = c.kv.get("py/operate")
    check(entry["Value"] == b"before", f"restored value {entry}")

    # The raft configuration, autopilot and reload.
    config = c.operator.raft_config()
    check(len(config["Servers"]) == 1 and config["Servers"][0]["Leader"], f"raft {config}")
    autopilot = c.operator.autopilot_configuration()
    check(autopilot["CleanupDeadServers"] is True, f"autopilot {autopilot}")
    index = autopilot["ModifyIndex"]
    check(
        c.operator.update_autopilot_configuration(cleanup_dead_servers=False, max_trailing_logs=100, cas=index)
        is True,
        "autopilot set with cas",
    )
    check(
        c.operator.update_autopilot_configuration(cleanup_dead_servers=True, cas=index) is False,
        "autopilot set with a stale cas",
    )
    autopilot = c.operator.autopilot_configuration()
    check(
        autopilot["CleanupDeadServers"] is False and autopilot["MaxTrailingLogs"] == 100,
        f"autopilot after set {autopilot}",
    )
    check(c.agent.reload(), "reload")

    # The gossip keyring: install a key, make it primary, remove the old one.
    pools = c.operator.keyring_list()
    check(
        len(pools) == 1 and pools[0]["Keys"] == {key: 1} and pools[0]["PrimaryKeys"] == {key: 1},
        f"keyring {pools}",
    )
    check(c.operator.keyring_install(new_key), "keyring install")
    check(c.operator.keyring_list()[0]["Keys"] == {key: 1, new_key: 1}, "both keys installed")
    check(c.operator.keyring_use(new_key), "keyring use")
    try:
        c.operator.keyring_remove(new_key)
        check(False, "removing the primary key was accepted")
    except consul.ConsulException as e:
        check("Removing the primary key is not allowed" in str(e), f"refusal {e}")
    check(c.operator.keyring_remove(key), "keyring remove")
    pools = c.operator.keyring_list(local_only=True)
    check(pools[0]["Keys"] == {new_key: 1} and pools[0]["PrimaryKeys"] == {new_key: 1}, f"rotated {pools}")

    passed("py-consul operate")


if __name__ == "__main__":
    main(*sys.argv[1:5])
