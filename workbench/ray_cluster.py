"""A Ray cluster as the workbench uses it (``--ray ADDRESS``): connecting, with a clear error where none
answers, and the rules that turn a spec into a task's resources and environment. The sweep's and the study's
launchers (`workbench.sweep.ray_launch`, `workbench.tune.ray_trials`) build on these.

Ray's own docs cover clusters (``ray start --head`` / ``ray start --address``, KubeRay, SLURM); since Ray
2.59 a cluster started on one machine uses token authentication, so export ``RAY_AUTH_MODE=token`` on every
node and on the machine that runs ``wb`` alike.
"""

from __future__ import annotations

import os
from typing import Any

ENV_PREFIXES = ("WB_", "HF_", "MLFLOW_", "TRANSFORMERS_", "HUGGINGFACE_")  # passed to every task


class ClusterError(ValueError):
    """Ray missing or unreachable, or a task asking for what the cluster lacks; one line with the fix."""


def point_resources(device: str, cpus: float, cluster_gpus: float) -> dict[str, float]:
    """Ray resources for one point on ``device`` (its ``model.device``): ``{"num_cpus": cpus, "num_gpus": g}``
    with g = 1 for ``model.device``
    ``cuda`` / ``cuda:N`` (Ray sets ``CUDA_VISIBLE_DEVICES``: the point sees its GPU as ``cuda:0``), or for
    ``auto`` on a cluster that has GPUs; else 0.

    Raises:
        ClusterError: ``cuda`` on a cluster without GPUs (the task would never be scheduled).
    """
    gpus = 1.0 if device.startswith("cuda") or (device == "auto" and cluster_gpus > 0) else 0.0
    if gpus and cluster_gpus < gpus:
        raise ClusterError(f"model.device={device}: the Ray cluster has no GPU; set model.device=cpu or add GPU nodes")
    return {"num_cpus": cpus, "num_gpus": gpus}


def task_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The driver's ``WB_*``, ``HF_*``, ``MLFLOW_*`` and ``TRANSFORMERS_*`` variables, for every task's
    ``runtime_env`` (a node started by ``ray start`` has its own environment)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(ENV_PREFIXES)}


def absolute_store(uri: str, cwd: str) -> str:
    """A relative sqlite URI (``sqlite:///mlflow.db``) made absolute against the driver's ``cwd``, so a task
    writes the driver's store wherever Ray starts it; other URIs unchanged."""
    from sqlalchemy.engine import make_url

    if not uri.startswith("sqlite:"):
        return uri
    db = make_url(uri).database
    if not db or db == ":memory:" or os.path.isabs(db):
        return uri
    return f"sqlite:///{os.path.join(cwd, db)}"


def connect(address: str) -> Any:
    """``ray.init(address)``: ``local`` starts a cluster in this process's machine, ``auto`` joins the one
    ``ray start`` began here (or ``$RAY_ADDRESS``), ``HOST:PORT`` / ``ray://HOST:PORT`` a remote one.

    Raises:
        ClusterError: Ray is not installed (the install line), or the cluster cannot be reached.
    """
    try:
        import ray
    except ImportError:
        raise ClusterError("--ray needs Ray: pip install 'speculation-workbench[ray]' (or pip install ray)") from None
    if ray.is_initialized():
        return ray
    reachable(address)
    try:
        ray.init(
            address=address, include_dashboard=False, logging_level="WARNING", log_to_driver=True,
            configure_logging=True,
        )  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterError(
            f"--ray {address}: cannot join the Ray cluster ({str(e).splitlines()[0]}); start one with "
            "`ray start --head`, or use --ray local; a cluster with token authentication (Ray >= 2.59 on one "
            "machine) needs RAY_AUTH_MODE=token here too"
        ) from None
    return ray


def reachable(address: str, timeout: float = 5.0) -> None:
    """For a ``HOST:PORT`` address, one TCP connection to it (Ray itself waits on an absent cluster for
    minutes, retrying); other addresses (``local``, ``auto``, ``ray://``) are left to Ray.

    Raises:
        ClusterError: nothing listens there.
    """
    import socket as sock

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        sock.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ClusterError(
            f"--ray {address}: no Ray cluster answers there ({e.strerror or e}); start one with "
            "`ray start --head` (it prints the address) or use --ray local"
        ) from None


def describe(ray: Any) -> str:
    """``N nodes, C CPUs, G GPUs``: the live cluster, for the first lines of a sweep or a study."""
    alive = [x for x in ray.nodes() if x.get("Alive")]
    res = ray.cluster_resources()
    return f"{len(alive)} nodes, {res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs"
