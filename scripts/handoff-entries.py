#!/usr/bin/env python3
"""Raft entries per Consul-style lock handoff, on a running agent that runs the server role.

N contenders, each with its own session, run Consul's lock recipe on one key: block on the key
until no session holds it, `PUT ?acquire`, and on a refusal block again. The holder releases
at once, so every release wakes every waiter and each of them asks to acquire. The raft log's
last index (`Stats.raft.last_log_index` of `/v1/agent/self`) before and after H handoffs gives
the entries per handoff; `X-Consul-Index` of the key gives the ops.

    scripts/handoff-entries.py http://127.0.0.1:8500 [contenders] [handoffs]
"""

import json
import os
import sys
import threading
import urllib.request

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8500"
CONTENDERS = int(sys.argv[2]) if len(sys.argv) > 2 else 32
HANDOFFS = int(sys.argv[3]) if len(sys.argv) > 3 else 200
KEY = f"handoff-entries/{os.getpid()}"


def call(method, path, body=b""):
    request = urllib.request.Request(BASE + path, data=body if method == "PUT" else None,
                                     method=method)
    with urllib.request.urlopen(request, timeout=120) as reply:
        return reply.read(), reply.headers


def last_log_index():
    body, _ = call("GET", "/v1/agent/self")
    return int(json.loads(body)["Stats"]["raft"]["last_log_index"])


def holder_and_index(index):
    try:
        body, headers = call("GET", f"/v1/kv/{KEY}?index={index}&wait=30s")
        entry = json.loads(body)[0]
        return entry.get("Session"), int(headers["X-Consul-Index"])
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None, int(e.headers["X-Consul-Index"])
        raise


done = threading.Event()
lock = threading.Lock()
counts = {"handoffs": 0, "refused": 0}


def contender():
    session = json.loads(call("PUT", "/v1/session/create", b'{"LockDelay":"0s"}')[0])["ID"]
    index = 0
    while not done.is_set():
        holder, index = holder_and_index(index)
        if holder:
            continue
        granted = json.loads(call("PUT", f"/v1/kv/{KEY}?acquire={session}", b"x")[0])
        if not granted:
            with lock:
                counts["refused"] += 1
            continue
        with lock:
            counts["handoffs"] += 1
            if counts["handoffs"] >= HANDOFFS:
                done.set()
        call("PUT", f"/v1/kv/{KEY}?release={session}", b"x")


call("PUT", f"/v1/kv/{KEY}", b"x")
before = last_log_index()
threads = [threading.Thread(target=contender, daemon=True) for _ in range(CONTENDERS)]
for t in threads:
    t.start()
done.wait()
after = last_log_index()
handoffs = counts["handoffs"]
print(f"contenders={CONTENDERS} handoffs={handoffs} refused_acquires={counts['refused']} "
      f"raft_entries={after - before} ({(after - before - CONTENDERS) / handoffs:.2f} per "
      f"handoff, session creations aside)")
