"""Drives a Vigil agent with py-consul, a real Consul client library, unchanged.

Usage: consul_client.py HOST PORT. Exits non-zero on the first failed check.
"""

import sys
import threading

import consul
from checks import check, passed

def main(host, port):
    c = consul.Consul(host=host, port=int(port))

    # Sessions: py-consul sends lowercase field names and lock delay as "Ns".
    s1 = c.session.create(name="py-one", behavior="release", ttl=10, lock_delay=0)
    s2 = c.session.create(name="py-two", behavior="delete", lock_delay=1)
    _, info = c.session.info(s1)
    check(info["Name"] == "py-one" and info["TTL"] == "10s", f"session info {info}")
    check(info["LockDelay"] == 0, "lock delay 0 kept")
    _, info2 = c.session.info(s2)
    check(info2["Behavior"] == "delete" and info2["LockDelay"] == 1_000_000_000, f"{info2}")
    _, listed = c.session.list()
    check({s["ID"] for s in listed} >= {s1, s2}, "both sessions listed")
    renewed = c.session.renew(s1)
    check(renewed["ID"] == s1, "renew returns the session")

    # A lock: the first session gets it, the second does not.
    check(c.kv.put("py/lock", "holder-1", acquire=s1) is True, "s1 acquires")
    check(c.kv.put("py/lock", "holder-2", acquire=s2) is False, "s2 is refused")
    index, entry = c.kv.get("py/lock")
    check(entry["Session"] == s1 and entry["LockIndex"] == 1, f"entry {entry}")
    check(entry["Value"] == b"holder-1", "value round-trips")

    # A blocking GET wakes when the holder releases.
    woke = {}

    def watch():
        woke["index"], woke["entry"] = c.kv.get("py/lock", index=index, wait="10s")

    t = threading.Thread(target=watch)
    t.start()
    check(c.kv.put("py/lock", "released", release=s1) is True, "s1 releases")
    t.join(15)
    check(not t.is_alive(), "blocking get returned")
    # py-consul gives the index as the header's text: compare numbers, not strings.
    check(int(woke["index"]) > int(index), "index moved")
    check("Session" not in woke["entry"], "released entry has no session")

    # The other session can now take it; LockIndex counts acquisitions.
    check(c.kv.put("py/lock", "holder-2", acquire=s2) is True, "s2 acquires after release")
    _, entry = c.kv.get("py/lock")
    check(entry["LockIndex"] == 2, f"LockIndex 2, got {entry['LockIndex']}")

    # Destroying a delete-behaviour session deletes the key it held.
    check(c.session.destroy(s2) is True, "destroy")
    _, entry = c.kv.get("py/lock")
    check(entry is None, "key deleted with its session")

    # Recursive reads, keys with a separator, cas and delete.
    c.kv.put("py/tree/a", "1")
    c.kv.put("py/tree/b/c", "2")
    _, keys = c.kv.get("py/tree/", keys=True, separator="/")
    check(keys == ["py/tree/a", "py/tree/b/"], f"keys {keys}")
    _, entries = c.kv.get("py/tree/", recurse=True)
    check([e["Key"] for e in entries] == ["py/tree/a", "py/tree/b/c"], "recurse")
    _, a = c.kv.get("py/tree/a")
    check(c.kv.put("py/tree/a", "3", cas=a["ModifyIndex"]) is True, "cas with current index")
    check(c.kv.put("py/tree/a", "4", cas=a["ModifyIndex"]) is False, "cas with stale index")
    check(c.kv.delete("py/tree", recurse=True) is True, "delete recurse")
    _, gone = c.kv.get("py/tree/", recurse=True)
    check(gone is None, "tree gone")

    # Transactions.
    result = c.txn.put(
        [
            {"KV": {"Verb": "set", "Key": "py/txn", "Value": "dGVzdA=="}},
            {"KV": {"Verb": "get", "Key": "py/txn"}},
        ]
    )
    check(result["Results"][1]["KV"]["Value"] == "dGVzdA==", f"txn {result}")

    # Status endpoints.
    check(c.status.leader() != "", "leader known")
    check(len(c.status.peers()) == 1, "one peer")

    c.session.destroy(s1)
    passed()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
