"""Patroni, unchanged, keeping a three-node PostgreSQL cluster highly available through a Vigil
agent (its `consul` DCS): a leader is elected and replicated to, a leader killed with SIGKILL is
replaced by a replica, the killed node rejoins as a replica, a switchover moves the leader, and
a graceful stop releases the leader key. Used by scripts/patroni-tooz-tests.sh.

Usage: patroni_failover.py VIGIL PATRONI WORKDIR. PostgreSQL refuses to run as root, so when
run as root the Patroni nodes run as the `postgres` user (WORKDIR must be theirs to write).
Exits non-zero at the first failed check."""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import psycopg2
import requests
from checks import check, passed

SCOPE = "vigil-patroni"
PG_BIN = "/usr/lib/postgresql/15/bin"
TTL = 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, limit, probe):
    """Polls `probe` until it returns something truthy, which it returns; fails after `limit`."""
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            value = probe()
        except (requests.RequestException, psycopg2.Error, ValueError, KeyError):
            value = None
        if value:
            return value
        time.sleep(0.5)
    check(False, f"{what} within {limit} s")
    return None


class Node:
    def __init__(self, name, workdir, consul):
        self.name = name
        self.rest = free_port()
        self.pg = free_port()
        self.dir = os.path.join(workdir, name)
        os.makedirs(self.dir, exist_ok=True)
        self.config = os.path.join(self.dir, "patroni.yml")
        config = {
            "scope": SCOPE,
            "name": name,
            "restapi": {"listen": f"127.0.0.1:{self.rest}",
                        "connect_address": f"127.0.0.1:{self.rest}"},
            "consul": {"host": consul},
            "bootstrap": {
                "dcs": {"ttl": TTL, "loop_wait": 2, "retry_timeout": 8,
                        "postgresql": {"use_pg_rewind": True}},
                "initdb": [{"encoding": "UTF8"}],
                "pg_hba": ["host replication replicator 127.0.0.1/32 trust",
                           "host all all 127.0.0.1/32 trust"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg}",
                "connect_address": f"127.0.0.1:{self.pg}",
                "data_dir": os.path.join(self.dir, "data"),
                "bin_dir": PG_BIN,
                "pgpass": os.path.join(self.dir, "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "pg"},
                    "replication": {"username": "replicator", "password": "rep"},
                    "rewind": {"username": "rewinder", "password": "rew"},
                },
                "parameters": {"unix_socket_directories": self.dir},
            },
        }
        # JSON is YAML.
        with open(self.config, "w") as f:
            json.dump(config, f)
        self.proc = None

    def start(self, patroni):
        args = [patroni, self.config]
        if os.geteuid() == 0:
            args = ["runuser", "-u", "postgres", "--"] + args
        log = open(os.path.join(self.dir, "patroni.log"), "a")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def signal(self, sig):
        """Signals Patroni and every process it started (PostgreSQL included)."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self, limit=60):
        self.signal(signal.SIGTERM)
        if self.proc:
            try:
                self.proc.wait(limit)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait()

    def kill9(self):
        self.signal(signal.SIGKILL)
        self.proc.wait()

    def status(self):
        return requests.get(f"http://127.0.0.1:{self.rest}/patroni", timeout=3).json()

    def sql(self, query, *args):
        conn = psycopg2.connect(host="127.0.0.1", port=self.pg, user="postgres",
                                password="pg", dbname="postgres", connect_timeout=3)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(query, args)
                return cur.fetchall() if cur.description else None
        finally:
            conn.close()


def leader_key(consul):
    reply = requests.get(f"http://{consul}/v1/kv/service/{SCOPE}/leader", timeout=3)
    if reply.status_code == 404:
        return None
    reply.raise_for_status()
    return reply.json()[0]


def decoded(entry):
    return base64.b64decode(entry["Value"]).decode() if entry and entry["Value"] else None


def roles(nodes):
    out = {}
    for node in nodes:
        try:
            status = node.status()
            out[node.name] = (status.get("role"), status.get("state"))
        except (requests.RequestException, ValueError):
            out[node.name] = (None, None)
    return out


def one_leader(nodes, consul, among=None):
    """The name of the one running primary whose name is in the leader key, when every other
    node of `among` runs as a replica."""
    among = among or nodes
    current = roles(among)
    primaries = [n for n, (role, state) in current.items()
                 if role == "primary" and state == "running"]
    replicas = [n for n, (role, state) in current.items()
                if role == "replica" and state in ("running", "streaming")]
    if len(primaries) != 1 or len(replicas) != len(among) - 1:
        return None
    if decoded(leader_key(consul)) != primaries[0]:
        return None
    return primaries[0]


def sees(node, value):
    rows = node.sql("SELECT v FROM drill WHERE v = %s", value)
    return bool(rows)


def main(vigil, patroni, workdir):
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    http = free_port()
    consul = f"127.0.0.1:{http}"
    agent = subprocess.Popen(
        [vigil, "agent", "--dev", "--node", "patroni-agent", "--http-addr", consul,
         "--rpc-addr", "127.0.0.1:0", "--serf-addr", "127.0.0.1:0", "--log-level", "warn"],
        stdout=open(os.path.join(workdir, "vigil.log"), "w"), stderr=subprocess.STDOUT)
    nodes = [Node(f"pg{i}", workdir, consul) for i in range(3)]
    if os.geteuid() == 0:
        shutil.chown(workdir, "postgres", "postgres")
        for node in nodes:
            shutil.chown(node.dir, "postgres", "postgres")
            shutil.chown(node.config, "postgres", "postgres")
    try:
        wait_for("the agent answering", 30,
                 lambda: requests.get(f"http://{consul}/v1/status/leader", timeout=2).json())

        # Bootstrap: one node initializes the cluster and takes the leader key, the others
        # clone it and stream from it.
        for node in nodes:
            node.start(patroni)
        by_name = {n.name: n for n in nodes}
        first = wait_for("a leader and two streaming replicas", 180,
                         lambda: one_leader(nodes, consul))
        check(first is not None, "bootstrap elected a leader")
        entry = leader_key(consul)
        check(entry["Session"], "the leader key is held by a session")
        session = requests.get(f"http://{consul}/v1/session/info/{entry['Session']}",
                               timeout=3).json()
        check(session and session[0]["TTL"], "the leader's session has a TTL")
        initialize = requests.get(f"http://{consul}/v1/kv/service/{SCOPE}/initialize", timeout=3)
        check(initialize.status_code == 200, "the cluster's initialize key exists")
        cluster_config = requests.get(f"http://{consul}/v1/kv/service/{SCOPE}/config",
                                      timeout=3).json()
        check(cluster_config, "the cluster's dynamic config is stored")
        members = requests.get(f"http://{consul}/v1/kv/service/{SCOPE}/members/?recurse",
                               timeout=3).json()
        check(len(members) == 3, f"three member keys: {[m['Key'] for m in members]}")

        # Writes on the leader reach both replicas.
        leader = by_name[first]
        leader.sql("CREATE TABLE drill (v text)")
        leader.sql("INSERT INTO drill VALUES ('before-failover')")
        for node in nodes:
            if node is not leader:
                wait_for(f"{node.name} replicating", 60, lambda n=node: sees(n, "before-failover"))
                check(True, f"{node.name} replicated the first write")

        # Failover: the leader is killed with SIGKILL (Patroni and PostgreSQL); its session
        # expires and a replica takes the leader key.
        leader.kill9()
        rest = [n for n in nodes if n is not leader]
        second = wait_for("a new leader after SIGKILL", 120,
                          lambda: one_leader(rest, consul, among=rest))
        check(second is not None and second != first, f"failover from {first} to {second}")
        check(leader_key(consul)["Session"] != entry["Session"],
              "the new leader holds the key with a session of its own")
        new_leader = by_name[second]
        new_leader.sql("INSERT INTO drill VALUES ('after-failover')")
        survivor = next(n for n in rest if n is not new_leader)
        wait_for(f"{survivor.name} following the new leader", 120,
                 lambda: sees(survivor, "after-failover"))
        check(True, f"{survivor.name} follows {second}")

        # The killed node comes back as a replica of the new leader.
        leader.start(patroni)
        wait_for(f"{first} rejoining as a replica", 180,
                 lambda: one_leader(nodes, consul) == second and sees(leader, "after-failover"))
        check(True, f"{first} rejoined as a replica and caught up")

        # Switchover through Patroni's REST API: the leader hands over to a named replica.
        target = leader.name
        reply = requests.post(f"http://127.0.0.1:{new_leader.rest}/switchover",
                              json={"leader": second, "candidate": target}, timeout=60)
        check(reply.status_code == 200, f"switchover accepted: {reply.status_code} {reply.text}")
        wait_for(f"{target} leading after the switchover", 120,
                 lambda: one_leader(nodes, consul) == target)
        check(True, f"switchover from {second} to {target}")
        by_name[target].sql("INSERT INTO drill VALUES ('after-switchover')")
        for node in nodes:
            wait_for(f"{node.name} seeing the write after the switchover", 60,
                     lambda n=node: sees(n, "after-switchover"))
        check(True, "every node has the write made after the switchover")

        # A graceful stop of every node releases the leader key.
        for node in nodes:
            node.stop()
        wait_for("the leader key released", 30, lambda: leader_key(consul) is None
                 or not leader_key(consul).get("Session"))
        check(True, "the stopped leader released its key")
        passed("patroni")
    finally:
        for node in nodes:
            node.stop()
        agent.terminate()
        agent.wait(30)


if __name__ == "__main__":
    main(*sys.argv[1:4])
