"""Several `wb sweep --name X` workers on one MLflow store: who runs which point.

The single-machine default, needing nothing installed. On a cluster Ray schedules the points instead
(`wb sweep --ray`, `workbench.sweep.ray_launch`): resources per point, placement, retries as soon as a
node is declared dead, no clocks to keep in step.

A point's child run *is* its claim: a worker creates it RUNNING (tags ``workbench.sweep.point``,
``workbench.sweep.worker`` = host:pid:id, ``workbench.sweep.heartbeat`` = unix seconds) before it
prepares anything, then logs the point into it (``run_experiment(run_id=...)``). The rule, read by
every worker from the store alone (:func:`point_state`, :func:`claim_point`):

- **done**: the point has a FINISHED child: nobody runs it again (resume, as before).
- **busy**: a RUNNING child whose heartbeat is at most ``timeout`` seconds old is a *live claim*:
  another worker is on it; move on (and come back: a worker waits for live claims before its table).
- **stale**: a RUNNING child whose heartbeat is older than ``timeout`` (its worker was killed or
  lost the store), or whose worker ran on this host in a process that no longer exists (``kill -9``:
  no need to wait out the timeout), is marked FAILED with tag ``workbench.sweep.stale`` and the point
  is open again.
- **failed**: a FAILED child started since this worker started (not stale): this pass tried it and
  it raised; it is not retried until the next `wb sweep` (as a single worker does).
- **open**: otherwise a worker claims it: it creates its child, waits ``settle_s`` (so that every
  claim made at the same moment is visible), lists the live claims of the point again and the
  earliest (start_time, run_id) wins; a loser ends its claim KILLED, deletes it and moves on.

While the point runs a daemon thread refreshes the heartbeat every ``timeout / 4`` seconds. A worker
that stalls past ``timeout`` while alive finds its claim failed at its next heartbeat and its run
ends FAILED at its next GRPO step (:class:`ClaimLost`), so the point is not finished twice (bar a
stall in the point's last moments; readers then take the newest FINISHED run,
`workbench.runs.latest_per_point`).

Times: start_time and heartbeats are the workers' own clocks, so machines sharing a sweep need
clocks in step (NTP) to well under ``settle_s`` and ``timeout``; the timeout is judged by the worker
that reads the claim, so give all workers the same ``--claim-timeout``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workbench.tags import TAG_HEARTBEAT, TAG_HOST, TAG_STALE, TAG_WORKER

CLAIM_TIMEOUT_S = (
    60.0  # as `wb tune`'s Optuna grace period: a loaded 2-core VM can delay a heartbeat by tens of seconds
)
SETTLE_S = 2.0  # between creating a claim (or a parent) and reading who won
POLL_S = 2.0  # how often a worker with nothing left to claim looks at the live claims of others


class ClaimLost(RuntimeError):
    """This worker's claim was failed as stale by another worker (its heartbeat stalled past the timeout)."""


def worker_id() -> str:
    """``host:pid:8 hex``: names this `wb sweep` process in its claims."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def last_beat(run: Any) -> float:
    """Unix seconds of a claim's last heartbeat (its start time if it has none: an older workbench)."""
    try:
        return float(run.tags[TAG_HEARTBEAT])
    except (KeyError, ValueError):
        return run.start_time / 1000


def local_pid(run: Any) -> int | None:
    """The process id of a claim's worker when it ran on this host (its worker id ``host:pid:hex`` and its
    host tag name this machine), else None."""
    host, pid, _ = (run.tags.get(TAG_WORKER, "").rsplit(":", 2) + ["", ""])[:3]
    here = socket.gethostname()
    if host != here or run.tags.get(TAG_HOST, here) != here or not pid.isdigit():
        return None
    return int(pid)


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (signal 0: nothing is sent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, as another user's
        return True
    return True


def dead_here(run: Any) -> bool:
    """A claim of a worker on this host whose process is gone (``kill -9``, a crash): dead at once, whatever
    its heartbeat's age (a re-run need not wait out the timeout)."""
    pid = local_pid(run)
    return pid is not None and not process_alive(pid)


def is_live(run: Any, now: float, timeout: float) -> bool:
    return run.status == "RUNNING" and now - last_beat(run) <= timeout and not dead_here(run)


def stale_reason(run: Any, now: float, timeout: float) -> str:
    """Why a RUNNING claim is not live, for its ``workbench.sweep.stale`` tag."""
    who = run.tags.get(TAG_WORKER, "?")
    if dead_here(run):
        return f"worker {who}: its process {local_pid(run)} on this host is gone"
    return f"no heartbeat for {now - last_beat(run):.0f} s (timeout {timeout:g} s) from worker {who}"


def first_claim(runs: list[Any]) -> Any | None:
    """The winning claim among ``runs``: earliest (start_time, run_id), the same for every reader."""
    return min(runs, key=lambda r: (r.start_time, r.run_id), default=None)


@dataclass
class PointState:
    """``done`` | ``busy`` | ``failed`` | ``open`` | ``claimed`` (this worker won), with the run that says so."""

    kind: str
    run: Any = None
    stale: list[Any] = field(default_factory=list)  # RUNNING claims of dead workers, to be failed


def point_state(runs: list[Any], now: float, timeout: float, since_ms: int) -> PointState:
    """The state of one point from its child runs (RunRecord-like: run_id, status, tags, start_time),
    by the rule in the module docstring (first match wins)."""
    finished = [r for r in runs if r.status == "FINISHED"]
    if finished:
        return PointState("done", max(finished, key=lambda r: (r.start_time, r.run_id)))
    live = [r for r in runs if is_live(r, now, timeout)]
    if live:
        return PointState("busy", first_claim(live))
    stale = [r for r in runs if r.status == "RUNNING"]
    failed = [r for r in runs if r.status == "FAILED" and TAG_STALE not in r.tags and r.start_time >= since_ms]
    if failed:
        return PointState("failed", max(failed, key=lambda r: r.start_time), stale)
    return PointState("open", None, stale)


def claim_point(
    store: Any,
    key: str,
    run_name: str,
    tags: dict[str, str],
    worker: str,
    since_ms: int,
    timeout: float = CLAIM_TIMEOUT_S,
    settle_s: float = SETTLE_S,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> PointState:
    """Try to claim point ``key``: its state, ``claimed`` (with this worker's run) when it won.

    ``store``: ``point_runs(key)``, ``create_claim(run_name, tags) -> run_id``, ``fail(run_id, why)``,
    ``drop(run_id)`` (`workbench.sweep.store.SweepStore`, or a fake in tests).
    """
    st = point_state(store.point_runs(key), clock(), timeout, since_ms)
    stale = st.stale
    for r in stale:
        r.tags[TAG_STALE] = stale_reason(r, clock(), timeout)
        store.fail(r.run_id, r.tags[TAG_STALE])
    if st.kind != "open":
        return st
    mine = store.create_claim(
        run_name, {**tags, TAG_WORKER: worker, TAG_HOST: socket.gethostname(), TAG_HEARTBEAT: f"{clock():.3f}"}
    )
    try:
        sleep(settle_s)
        st = point_state(store.point_runs(key), clock(), timeout, since_ms)
    except KeyboardInterrupt:
        store.drop(mine)  # not left RUNNING for the others to wait out
        raise
    if st.kind == "busy" and st.run.run_id == mine:
        return PointState("claimed", st.run, stale)  # stale: the dead workers' claims it takes over
    store.drop(mine)  # a claim made at the same moment came first (or the point got done)
    return st


class Heartbeat:
    """``with Heartbeat(client, run_id, interval):`` refreshes the claim's heartbeat tag from a daemon
    thread; ``lost`` turns True when the run is no longer RUNNING (failed as stale by another worker).
    :meth:`check` is a ``run_experiment`` ``on_step`` hook: it raises :class:`ClaimLost` then."""

    def __init__(self, client: Any, run_id: str, interval: float):
        self.client, self.run_id, self.interval = client, run_id, interval
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"wb-sweep-heartbeat-{run_id[:8]}", daemon=True)

    def _loop(self) -> None:
        while True:  # a beat at once, then every interval
            try:
                if self.client.get_run(self.run_id).info.status != "RUNNING":
                    self.lost = True
                    return
                self.client.set_tag(self.run_id, TAG_HEARTBEAT, f"{time.time():.3f}")
            except Exception:  # noqa: BLE001 - a busy store: the next beat tries again
                pass
            if self._stop.wait(self.interval):
                return

    def check(self, step: int, metrics: dict[str, float]) -> None:
        if self.lost and not self._stop.is_set():
            raise ClaimLost(
                f"claim {self.run_id} was failed as stale by another worker (heartbeat late); it runs the point"
            )

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
