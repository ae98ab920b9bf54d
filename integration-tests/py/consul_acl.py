"""Drives a Vigil dev agent's ACLs with py-consul, unchanged: tokens, policies and roles, and
a token limited to one key prefix (the agent runs with --acl-default-policy deny and
--acl-initial-management-token ROOT).

Usage: consul_acl.py HOST PORT ROOT
Exits non-zero on the first failed check.
"""

import json
import sys

import consul
from checks import check, passed

def refused(call, what):
    try:
        call()
    except consul.ACLPermissionDenied:
        check(True, what)
        return
    raise SystemExit(f"FAILED: {what} was allowed")


def main(host, port, root):
    c = consul.Consul(host=host, port=int(port), token=root)

    me = c.acl.token.read_self()
    check(me["Description"] == "Initial Management Token", f"self: {me}")

    # py-consul sends rules as JSON (it encodes what it is given).
    rules = {"key_prefix": {"app/": {"policy": "write"}}, "session_prefix": {"": {"policy": "write"}}}
    policy = c.acl.policy.create(name="app", rules=rules, description="the app")
    check(policy["Name"] == "app" and json.loads(policy["Rules"]) == rules, f"policy: {policy}")
    check(c.acl.policy.read(policy["ID"])["Description"] == "the app", "policy read")
    policy = c.acl.policy.update(policy["ID"], name="app", rules=rules, description="our app")
    check(policy["Description"] == "our app", f"policy update: {policy}")
    names = [p["Name"] for p in c.acl.policy.list()]
    check("app" in names and "global-management" in names, f"policies: {names}")

    role = c.acl.role.create(name="app-role", policies_id=[policy["ID"]])
    check(role["Policies"][0]["Name"] == "app", f"role: {role}")
    check(c.acl.role.read_by_name("app-role")["ID"] == role["ID"], "role by name")
    check(any(r["ID"] == role["ID"] for r in c.acl.role.list()), "role list")

    token = c.acl.token.create(description="app", roles_name=["app-role"])
    check(token["Roles"][0]["Name"] == "app-role", f"token: {token}")
    read = c.acl.token.read(token["AccessorID"])
    check(read["SecretID"] == token["SecretID"], "token read")
    updated = c.acl.token.update(token["AccessorID"], description="app v2", roles_name=["app-role"])
    check(updated["Description"] == "app v2", f"token update: {updated}")
    clone = c.acl.token.clone(token["AccessorID"], description="app clone")
    check(clone["SecretID"] != token["SecretID"] and clone["Roles"] == updated["Roles"], "clone")
    listed = c.acl.token.list(role=role["ID"])
    check({t["AccessorID"] for t in listed} == {token["AccessorID"], clone["AccessorID"]}, "token list")

    # The app's token: its prefix only.
    app = consul.Consul(host=host, port=int(port), token=token["SecretID"])
    session = app.session.create(name="app", ttl=30)
    check(app.kv.put("app/lock", "me", acquire=session), "acquire app/lock")
    check(app.kv.get("app/lock")[1]["Session"] == session, "read app/lock")
    refused(lambda: app.kv.get("other/lock"), "read other/lock")
    refused(lambda: app.kv.put("other/lock", "x"), "write other/lock")
    refused(lambda: app.acl.token.list(), "token list without acl:read")
    check(app.kv.put("app/lock", "", release=session), "release app/lock")
    check(app.session.destroy(session), "destroy own session")

    check(c.acl.token.delete(clone["AccessorID"]), "token delete")
    check(c.acl.role.delete(role["ID"]), "role delete")
    passed("py-consul acl")


if __name__ == "__main__":
    main(*sys.argv[1:])
