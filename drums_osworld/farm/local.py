"""A Ray cluster of several logical nodes on this machine, for tests and benchmarks.

    with LocalCluster(nodes=2) as cluster:          # head + 1 worker node, 127.0.0.1 only
        pool = DrumsPool(cluster.node_configs([inst_a, inst_b]))

Ray's ``ray.cluster_utils.Cluster`` with every address on 127.0.0.1 (Ray otherwise advertises and
dials the host's routable address: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps its node-address
lookup on loopback), no dashboard (``include_dashboard=False``), no usage stats
(``RAY_USAGE_STATS_ENABLED=0``), one logical CPU and a small object store per node, and a Ray
temp directory of its own (``/tmp/drums-ray-*``: sockets, logs). The driver's copy of Drums is put
first on the workers' ``PYTHONPATH`` (a checkout under test, not an installed copy).
:meth:`LocalCluster.shutdown` disconnects the driver, stops every Ray process it started, removes
its temp directory (``keep_logs=True`` keeps it) and restores the environment.

Each node's Drums daemon is an instance of its own (own state directory, socket, slot range and
nftables table): give each :class:`~drums_osworld.farm.pool.NodeConfig` its own
:class:`~drums_core.config.Instance` with a slot range that overlaps no other daemon's.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("drums.osworld.ray_local")

LOOPBACK = "127.0.0.1"
_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_DISABLE_DOCKER_CPU_WARNING": "1", "RAY_DEDUP_LOGS": "0"}

__all__ = ["LocalCluster"]


class LocalCluster:
    def __init__(self, nodes: int = 2, num_cpus: int = 1, object_store_mib: int = 128,
                 log_to_driver: bool = False, keep_logs: bool = False) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.count = nodes
        self.num_cpus = num_cpus
        self.object_store = object_store_mib << 20
        self.log_to_driver = log_to_driver
        self.keep_logs = keep_logs
        self.temp_dir: str | None = None
        self.cluster = None
        self._saved_env: dict[str, str | None] = {}

    def _set_env(self) -> None:
        pkg_parent = str(Path(__file__).resolve().parents[2])
        env = dict(_ENV)
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([pkg_parent, *[p for p in paths if p != pkg_parent]])
        self._saved_env.setdefault("RAY_TMPDIR", os.environ.get("RAY_TMPDIR"))
        for k, v in env.items():
            self._saved_env.setdefault(k, os.environ.get(k))
            os.environ[k] = v

    def _restore_env(self) -> None:
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env.clear()

    def start(self) -> "LocalCluster":
        # short: Ray's unix socket paths live under it (108 bytes at most)
        self.temp_dir = tempfile.mkdtemp(prefix="drums-ray-", dir="/tmp")
        ray_dir = os.path.join(self.temp_dir, "ray")
        os.mkdir(ray_dir)
        self._set_env()
        os.environ["RAY_TMPDIR"] = self.temp_dir  # Ray's default temp dir and its address file
        try:
            import ray
            import ray._private.ray_constants as ray_constants
            from ray.cluster_utils import Cluster

            # read at import time from the environment; this process may have imported Ray before
            ray_constants.ENABLE_RAY_CLUSTER = False
            if ray.is_initialized():
                raise RuntimeError("Ray is already initialised in this process")
            common = {"num_cpus": self.num_cpus, "object_store_memory": self.object_store,
                      "node_ip_address": LOOPBACK, "temp_dir": ray_dir}
            self.cluster = Cluster(initialize_head=True, shutdown_at_exit=True,
                                   head_node_args={**common, "include_dashboard": False})
            for _ in range(self.count - 1):
                self.cluster.add_node(**common)
            self.cluster.wait_for_nodes()
            ray.init(address=self.cluster.address, include_dashboard=False, log_to_driver=self.log_to_driver,
                     logging_level=logging.WARNING, _node_ip_address=LOOPBACK, _temp_dir=ray_dir)
        except BaseException:
            self.shutdown()
            raise
        return self

    @property
    def node_ids(self) -> list[str]:
        """Ray node ids, the head's first."""
        assert self.cluster is not None
        return [n.node_id for n in self.cluster.list_all_nodes()]

    def node_configs(self, instances: list, capacities: list[int | None] | None = None,
                     daemon_env: dict | None = None, names: list[str] | None = None) -> list:
        """One :class:`NodeConfig` per node: the i-th node serves ``instances[i]``."""
        from .pool import NodeConfig

        ids = self.node_ids
        if len(instances) != len(ids):
            raise ValueError(f"{len(instances)} instances for {len(ids)} nodes")
        names = names or [chr(ord("a") + i) for i in range(len(ids))]
        caps = capacities or [None] * len(ids)
        return [NodeConfig(name=names[i], instance=instances[i], ray_node_id=ids[i], capacity=caps[i],
                           daemon_env=dict(daemon_env or {})) for i in range(len(ids))]

    def shutdown(self) -> None:
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        except ImportError:
            pass
        finally:
            try:
                if self.cluster is not None:
                    self.cluster.shutdown()
            finally:
                self.cluster = None
                if self.temp_dir and not self.keep_logs:
                    shutil.rmtree(self.temp_dir, ignore_errors=True)
                self._restore_env()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
