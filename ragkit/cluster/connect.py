"""Connecting the driver to a Ray cluster, offline and with a one-line error when it is not there."""

from __future__ import annotations

import ipaddress
import os
import socket

from ragkit.errors import ConfigError

# Ray's switches read by the driver (the cluster's own processes take theirs from `ray start`:
# README "On a Ray cluster"): no usage statistics, no dashboard, no metrics export.
RAY_OFFLINE_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
}


# A machine that vanishes (power, cable: no FIN or RST reaches the others) leaves every task
# its workers ran hanging in its owner's gRPC call until gRPC's keepalive gives up: Ray's
# default is 5 minutes of silence and then 2 more, and the node's death in the GCS (about a
# minute) does not end the call. Measured across hosts (tests/test_hosts.py, docs/cluster.md):
# a 20 s task on a node powered off was not retried in 240 s with the defaults, and was retried
# and done 73 s after the power-off with these. Every node and every driver needs them: the
# launcher (`python -m ragkit.cluster.local node`) and `connect` set them unless already set.
RAY_KEEPALIVE_ENV = {
    "RAY_grpc_client_keepalive_time_ms": "10000",
    "RAY_grpc_client_keepalive_timeout_ms": "10000",
}

CLIENT_ATTEMPTS = 3  # connects to a ray:// address before its error is the user's

_RESTORE: dict = {}  # Ray constants changed for a loopback cluster, put back on disconnect


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _split(address: str) -> tuple[str, int]:
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"invalid Ray cluster address {address!r}", hint="give host:port of the cluster's head, or \"auto\"")
    return host, int(port)


def resolve(address: str) -> str:
    """host:port of the cluster's head; "auto" = the cluster running on this machine."""
    if address != "auto":
        return address
    from ray._private import services

    try:
        found = services.get_ray_address_from_environment("auto", None)
    except Exception as exc:  # Ray raises ConnectionError or ValueError here
        raise ConfigError(f"no Ray cluster is running on this machine ({str(exc).splitlines()[0][:160]})",
                          hint="start one with `ray start --head`, or give its address") from None
    if not found or found == "auto":
        raise ConfigError("no Ray cluster is running on this machine", hint="start one with `ray start --head`, or give its address")
    return found


def connect(address: str, timeout_s: float = 5.0) -> bool:
    """Join the cluster at `address` as a driver. Returns True when this call connected
    (the caller disconnects), False when the process was already connected."""
    for k, v in RAY_OFFLINE_ENV.items():
        os.environ[k] = v
    for k, v in RAY_KEEPALIVE_ENV.items():
        os.environ.setdefault(k, v)
    import ray

    if ray.is_initialized():
        return False
    address = resolve(address)
    host, port = _split(address)
    try:  # Ray itself retries an unreachable head for minutes; say so in seconds
        with socket.create_connection((host.strip("[]"), port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}",
                          hint="is `ray start --head` running there? (setting cluster.address, --cluster)") from None
    if _is_loopback(host) and not address.startswith("ray://"):
        # A cluster on this machine's loopback (its nodes started with --node-ip-address 127.0.0.1):
        # Ray would otherwise swap 127.0.0.1 for the machine's outward address (and look for a
        # node there); this is what RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 sets, for this driver only.
        import ray._private.ray_constants as ray_constants

        _RESTORE.setdefault("ENABLE_RAY_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER)
        ray_constants.ENABLE_RAY_CLUSTER = False
    _notes_to_stderr()
    # Ray Client (ray://): the head's proxy starts a server process per client, and that start
    # fails now and then inside Ray (measured here: 1 of 5 connects, "Initialization failure
    # from server"; the proxy's fork of a gRPC process). A fresh attempt gets a fresh server.
    attempts = CLIENT_ATTEMPTS if address.startswith("ray://") else 1
    for attempt in range(attempts):
        try:
            ray.init(address=address, namespace="ragkit", logging_level="ERROR", log_to_driver=False)
            return True
        except Exception as exc:  # ConnectionError, RuntimeError, ValueError: all one line to the user
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            if attempt + 1 < attempts and "Initialization failure from server" in first:
                if ray.is_initialized():
                    ray.shutdown()
                continue
            raise ConfigError(f"cannot connect to the Ray cluster at {address}: {first}",
                              hint="check setting cluster.address (--cluster); a cluster with token authentication "
                              "needs its token here too (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN)") from None
    return True


def _notes_to_stderr() -> None:
    """Ray prints the cluster's error notes ("(raylet) Task ... failed ... will be retried")
    on the driver's stdout, where `--json` output goes: send them to stderr."""
    import ray._private.worker as ray_worker

    orig = ray_worker.print_to_stdstream
    if getattr(orig, "ragkit_stderr", False):
        return

    def to_stderr(data, ignore_prefix):
        return orig({**data, "is_err": True}, ignore_prefix)

    to_stderr.ragkit_stderr = True
    ray_worker.print_to_stdstream = to_stderr


def disconnect() -> None:
    import ray
    import ray._private.ray_constants as ray_constants

    if ray.is_initialized():
        ray.shutdown()
    if "ENABLE_RAY_CLUSTER" in _RESTORE:  # the next connect may be to another machine
        ray_constants.ENABLE_RAY_CLUSTER = _RESTORE.pop("ENABLE_RAY_CLUSTER")


def alive_nodes() -> list[dict]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def placements(n: int) -> list:
    """A scheduling strategy for each of `n` actors: actor i on alive node i (round robin),
    soft, so that an actor restarted after its node died goes to another. Ray's "SPREAD" is
    best effort: measured across hosts, 1 run in 3 put both of two actors on one node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted(alive_nodes(), key=lambda x: x.get("NodeManagerAddress", ""))
    if not nodes:
        return ["SPREAD"] * n
    return [NodeAffinitySchedulingStrategy(node_id=nodes[i % len(nodes)]["NodeID"], soft=True) for i in range(n)]
