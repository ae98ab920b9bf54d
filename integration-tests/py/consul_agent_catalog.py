"""Drives a Vigil dev agent (with script checks enabled) through py-consul's agent, catalog,
health and session calls, unchanged.

Usage: consul_agent_catalog.py HOST PORT NODE. Exits non-zero on the first failed check.
"""

import sys
import time

import consul
from checks import check, passed
from consul import Check

def eventually(what, probe, limit=20.0):
    """Polls `probe` until it returns something true, within `limit` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"FAILED: timed out waiting for {what}")


def main(host, port, node):
    c = consul.Consul(host=host, port=int(port))

    # The agent itself.
    me = c.agent.self()
    check(me["Config"]["NodeName"] == node, f"self {me['Config']}")
    check(all(k in me for k in ("Config", "DebugConfig", "Coord", "Member", "Stats", "Meta")), "self sections")
    members = c.agent.members()
    check([m["Name"] for m in members] == [node] and members[0]["Status"] == 1, f"members {members}")

    # Services with a TTL check and a script check; the TTL check's updates.
    check(c.agent.service.register("web", service_id="web1", port=8080, tags=["prod"],
                                   meta={"v": "1"}, check=Check.ttl("30s")) is True, "register web1")
    check(c.agent.service.register("web", service_id="web2", port=8081, tags=["staging"],
                                   check=Check.script(["/bin/sh", "-c", "exit 1"], "1s")) is True,
          "register web2 with a script check")
    services = c.agent.services()
    check(services["web1"]["Port"] == 8080 and services["web1"]["Tags"] == ["prod"], f"{services}")
    check(c.agent.check.ttl_pass("service:web1", "all good") is True, "ttl pass")
    agent_checks = c.agent.checks()
    check(agent_checks["service:web1"]["Status"] == "passing", f"{agent_checks}")
    check(agent_checks["service:web1"]["Output"] == "all good", "ttl note is the output")
    warned = eventually("the script check to warn",
                        lambda: c.agent.checks()["service:web2"]["Status"] == "warning")
    check(warned, "exit 1 is warning")
    check(c.agent.check.register("disk", Check.ttl("60s"), notes="disk space") is True, "node check")
    check(c.agent.check.ttl_warn("disk") is True, "ttl warn")
    check(c.agent.check.ttl_fail("disk") is True, "ttl fail")
    check(c.agent.checks()["disk"]["Status"] == "critical", "ttl fail is critical")
    check(c.agent.check.deregister("disk") is True, "check deregister")
    filtered = c.agent.services(filter_expr='"prod" in Tags')
    check(list(filtered) == ["web1"], f"agent services filter {filtered}")

    # Catalog and health see them after the agent's sync.
    _, services = c.catalog.services()
    check(sorted(services["web"]) == ["prod", "staging"], f"catalog services {services}")
    _, prod = c.catalog.services(filter_expr='"prod" in ServiceTags')
    check(prod == {"web": ["prod"]}, f"catalog services filter {prod}")
    _, nodes = c.catalog.nodes()
    check([n["Node"] for n in nodes] == [node], f"nodes {nodes}")
    _, instances = c.catalog.service("web")
    check(sorted(i["ServiceID"] for i in instances) == ["web1", "web2"], f"{instances}")
    _, tagged = c.catalog.service("web", tag="prod")
    check([i["ServiceID"] for i in tagged] == ["web1"], f"tag filter {tagged}")
    _, mine = c.catalog.node(node)
    check(set(mine["Services"]) >= {"web1", "web2"}, f"catalog node {mine}")
    _, healthy = c.health.service("web", passing=True)
    check([h["Service"]["ID"] for h in healthy] == ["web1"], f"passing {healthy}")
    _, all_web = c.health.service("web")
    check(len(all_web) == 2, f"health service {all_web}")
    _, web_checks = c.health.checks("web")
    check(sorted(x["CheckID"] for x in web_checks) == ["service:web1", "service:web2"], f"{web_checks}")
    _, warning = c.health.state("warning")
    check([x["CheckID"] for x in warning] == ["service:web2"], f"state warning {warning}")
    _, node_checks = c.health.node(node)
    check("serfHealth" in [x["CheckID"] for x in node_checks], f"health node {node_checks}")

    # Catalog writes of an external node, and their reads; the agent runs with
    # `--node-meta env:prod` (py-consul sends a registration's node_meta as a query parameter,
    # which Consul ignores).
    check(c.catalog.register("ext", "10.0.0.9", service={"Service": "db", "Port": 5432}) is True,
          "catalog register")
    _, ext = c.catalog.service("db")
    check([i["Node"] for i in ext] == ["ext"], f"catalog service {ext}")
    _, prod = c.catalog.nodes(node_meta={"env": "prod"})
    check([n["Node"] for n in prod] == [node], f"node-meta filter {prod}")
    check(c.catalog.deregister("ext") is True, "catalog deregister")

    # A session bound to a passing check goes with it.
    session = c.session.create(name="bound", checks=["serfHealth", "service:web1"], ttl=30)
    _, on_node = c.session.node(node)
    check(session in [s["ID"] for s in on_node], "session listed for the node")
    check(c.agent.check.ttl_fail("service:web1") is True, "fail the bound check")
    eventually("the bound session to go", lambda: c.session.info(session)[1] is None)

    # Maintenance: a service's, then the node's.
    check(c.agent.service.maintenance("web1", True, "deploy") is True, "service maintenance on")
    check("_service_maintenance:web1" in c.agent.checks(), "maintenance check added")
    check(c.agent.service.maintenance("web1", False) is True, "service maintenance off")
    check(c.agent.maintenance(True, "patching") is True, "node maintenance on")
    check("_node_maintenance" in c.agent.checks(), "node maintenance check")
    check(c.agent.maintenance(False) is True, "node maintenance off")

    # User events: fired, then listed (also by name) with their payload.
    fired = c.event.fire("deploy", "v2")
    check(fired["Name"] == "deploy", f"event fire {fired}")
    eventually("the event listed", lambda: any(e["ID"] == fired["ID"] for e in c.event.list()[1]))
    _, named = c.event.list(name="deploy")
    check([e["ID"] for e in named] == [fired["ID"]], f"event list by name {named}")
    check(named[0]["Payload"] == b"v2", f"event payload {named[0]['Payload']!r}")

    check(c.agent.service.deregister("web2") is True, "service deregister")
    check("web2" not in c.agent.services(), "web2 gone")
    passed("py-consul agent/catalog")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
