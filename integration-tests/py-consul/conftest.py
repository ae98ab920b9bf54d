"""py-consul's own test suite against Vigil: the fixtures of py-consul's root conftest.py
(which starts Consul in Docker) rebuilt to start `vigil agent --dev` on free ports, with ACLs
enabled (default deny, an initial management token) where the test asks for them. VIGIL names
the binary. Used by scripts/py-consul-tests.sh."""

import collections
import os
import subprocess
import time
import uuid

import pytest
import requests

ConsulInstance = collections.namedtuple("ConsulInstance", ["container", "port", "version"])
VIGIL = os.environ.get("VIGIL", "vigil")
CONSUL_BEHAVIOUR = "1.22.0"


def start_vigil(acl_token=None):
    # Port 8500, as in py-consul's containers: some tests point HTTP checks at localhost:8500.
    http = 8500
    args = [VIGIL, "agent", "--dev", "--timing-profile", "local", "--enable-script-checks",
            "--http-addr", f"127.0.0.1:{http}", "--serf-addr", "127.0.0.1:0",
            "--rpc-addr", "127.0.0.1:0", "--log-level", "warn"]
    if acl_token:
        args += ["--acl-default-policy", "deny", "--acl-initial-management-token", acl_token]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{http}/v1/status/leader", timeout=2).json():
                break
        except (requests.RequestException, ValueError):
            pass
        time.sleep(0.1)
    else:
        proc.kill()
        raise TimeoutError("vigil did not start")
    return proc, http


@pytest.fixture(scope="session", autouse=True)
def _unset_consul_token():
    os.environ.pop("CONSUL_HTTP_TOKEN", None)


def instance(acl_token=None):
    proc, port = start_vigil(acl_token)
    try:
        # The tests gate behaviour on Consul's version; Vigil's own version (agent/self's
        # Config.Version) says nothing about that, so they get the newest Consul py-consul 1.8
        # tests against, whose answers Vigil gives.
        yield ConsulInstance(proc, port, CONSUL_BEHAVIOUR)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def consul_instance():
    yield from instance()


@pytest.fixture
def acl_consul_instance():
    token = uuid.uuid4().hex
    for inst in instance(token):
        yield inst, token


@pytest.fixture
def consul_port(consul_instance):
    return consul_instance.port, consul_instance.version
