#!/usr/bin/env python3
"""RSS per idle blocking query on a running dev agent (agent and server in one process).

Opens N connections, each sending one blocking `GET /v1/kv/<key>?index=&wait=10m` (distinct
missing keys, or all one key with `--shared`), waits until the agent reports them all waiting
(`Stats.agent.blocking_queries`), lets them settle, and prints the agent's VmRSS and its
anonymous memory (`/proc/PID/smaps_rollup`) before and after, per watcher. Start the agent with
`--http-max-conns-per-client 0`; this process needs N open files.

    scripts/idle-watchers-rss.py PID http://127.0.0.1:8500 [N] [--shared]
"""

import json
import socket
import sys
import time
import urllib.request

PID = int(sys.argv[1])
BASE = sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3].isdigit() else 10_000
SHARED = "--shared" in sys.argv


def memory():
    status = open(f"/proc/{PID}/status").read()
    rss = next(int(l.split()[1]) for l in status.splitlines() if l.startswith("VmRSS:"))
    rollup = open(f"/proc/{PID}/smaps_rollup").read()
    anon = next(int(l.split()[1]) for l in rollup.splitlines() if l.startswith("Anonymous:"))
    return rss, anon


def stats():
    with urllib.request.urlopen(BASE + "/v1/agent/self") as reply:
        s = json.loads(reply.read())["Stats"]
    held = int(s["consul"]["blocking_queries"])
    # An agent that does not coalesce reports its watchers only as the server's.
    return (int(s["agent"].get("blocking_queries", held)),
            int(s["agent"].get("server_waits", held)), held)


host, port = BASE.removeprefix("http://").split(":")
urllib.request.urlopen(urllib.request.Request(BASE + "/v1/kv/watched", data=b"v", method="PUT"))
with urllib.request.urlopen(BASE + "/v1/kv/watched") as reply:
    index = int(reply.headers["X-Consul-Index"])
time.sleep(2)
before = memory()
sockets = []
for n in range(N):
    key = "watched" if SHARED else f"watched/{n}"
    s = socket.create_connection((host, int(port)))
    s.sendall(f"GET /v1/kv/{key}?index={index}&wait=10m HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    sockets.append(s)
while stats()[0] < N:
    time.sleep(0.5)
time.sleep(5)
after = memory()
watchers, waits, held = stats()
print(f"watchers={watchers} server_waits={waits} server_held={held} "
      f"rss_kib={before[0]}->{after[0]} ({(after[0] - before[0]) * 1024 / N:.0f} B/watcher) "
      f"anon_kib={before[1]}->{after[1]} ({(after[1] - before[1]) * 1024 / N:.0f} B/watcher)")
