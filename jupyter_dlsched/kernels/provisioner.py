"""The kernel provisioner of GPU kernelspecs: a kernel starts once the pool leased it GPUs.

Registered as ``dlsched-gpu`` under the ``jupyter_client.kernel_provisioners`` entry point,
so every Jupyter client (JupyterLab, ``jupyter_client.KernelManager``, nbclient, VS Code)
uses it for a kernelspec whose ``metadata.kernel_provisioner`` names it
(``dlsched kernels install``). Before the kernel process starts, ``pre_launch`` submits a
job of kind ``kernel`` to the same queue as every job, through the public ``Scheduler``
client, and waits in line without blocking the server's event loop; once the lease's job
process runs (``lease.hold``) the kernel starts with that job's grant in its environment
(``CUDA_VISIBLE_DEVICES``, ``DLSCHED_GPU_MEM`` for a share). The kernel itself is started
and signalled as ``LocalProvisioner`` does; only the lease is ours.

A restart keeps the lease; a shutdown ends it (``released``). Everything else that can end
a kernel is seen by the lease process, which the pool's supervisor runs: nothing here has to
survive for the GPU to go back.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning import LocalProvisioner
from tornado.web import HTTPError
from traitlets import Any as AnyTrait
from traitlets import Unicode

from ..inside.runtime import JOB_ID_ENV
from ..vocab.errors import DlschedError
from ..vocab.schema import TERMINAL
from ..vocab.units import parse_duration
from . import control, spares

PROVISIONER_NAME = "dlsched-gpu"
#: the IPython extension that reports a GPU kernel's cell activity to its lease
ACTIVITY_EXTENSION = "jupyter_dlsched.kernels.activity"
#: files of a control folder that belong to one lease (cleared when a new lease starts)
_LEASE_FILES = (
    "grant.json",
    "kernel.json",
    "restarting",
    "released",
    "activity.json",
    "warning.json",
    "ended.json",
    "suspended.json",
    "restored.json",
)
#: lease endings after which a restart must not queue for GPUs again
_FINAL_ENDINGS = ("reclaimed", "cancelled")


def _gpu_count(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0  # the lease's submit refuses it with the reason


class KernelLeaseError(DlschedError, HTTPError):
    """A GPU kernel could not get (or keep) its GPUs: cancelled, reclaimed, waited too long.

    Also a tornado ``HTTPError`` (503), so that a Jupyter server answers the request that
    started the kernel with this message (JupyterLab shows it) rather than "Unhandled error".
    """

    def __init__(self, message: str) -> None:
        DlschedError.__init__(self, message)
        HTTPError.__init__(self, 503, message, reason="GPU kernel not started")
        self.message = message

    def __str__(self) -> str:
        return self.message


def duration_or_none(text: object, field: str) -> float | None:
    """``"30m"`` -> 1800.0; ``"never"`` -> None."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("never", "")):
        return None
    return parse_duration(text, field)


class GpuKernelProvisioner(LocalProvisioner):
    """Starts a kernel once its lease (a ``kernel`` job) holds its GPUs."""

    gpus = AnyTrait(1, help="GPUs the kernel leases: a whole number or a share").tag(config=True)
    gpu_mem = AnyTrait(None, allow_none=True, help="GPU memory of a share, e.g. 8GiB").tag(
        config=True
    )
    cpus = AnyTrait(
        None, allow_none=True, help="CPU cores of the lease (None: the pool's default)"
    ).tag(config=True)
    mem = AnyTrait(None, allow_none=True, help="memory of the lease, e.g. 32GiB").tag(config=True)
    priority = AnyTrait("normal", help="the lease's priority in the queue").tag(config=True)
    idle = Unicode("30m", help="idle time before a warning while work waits, or never").tag(
        config=True
    )
    idle_grace = Unicode("5m", help="time after the warning before the GPUs go").tag(config=True)
    wait_limit = Unicode("10m", help="longest wait in line before the start fails").tag(config=True)
    home = Unicode(None, allow_none=True, help="the pool's state folder").tag(config=True)

    job_id: str | None = None
    folder: Path | None = None
    _scheduler: Any = None
    _restart_asked = False
    #: started by a job's own process (a notebook job runs its notebook's kernel): no lease
    _in_job = False

    # -- the lease -------------------------------------------------------------------------

    def _client(self) -> Any:
        if self._scheduler is None:
            from ..client.scheduler import Scheduler

            home = self.home or os.environ.get("DLSCHED_HOME") or None
            self._scheduler = Scheduler(home, loop=False)
        return self._scheduler

    async def _lease_alive(self) -> bool:
        if self.job_id is None or self.folder is None:
            return False
        ended = control.read(self.folder, "ended.json")
        if ended is not None:
            # Jupyter's restarter restarts a dead kernel at once (shutdown with now=True,
            # which skips shutdown_requested): after a reclaim that must not take the GPU
            # straight back. A restart someone asked for waits in line again.
            if ended.get("ended") in _FINAL_ENDINGS and not self._restart_asked:
                raise KernelLeaseError(
                    f"this kernel's GPU lease {self.job_id} ended: {ended.get('message')}; "
                    "restart the kernel or start a new one to wait for a GPU again"
                )
            return False
        info = await asyncio.to_thread(self._client().info, self.job_id)
        return bool(info.state == "running")

    async def _acquire(self, env: dict[str, str]) -> dict[str, Any]:
        """Submit the lease and wait in line until its job process holds the grant."""
        self.folder = control.runtime_folder(self.kernel_id)
        for name in _LEASE_FILES:
            control.unmark(self.folder, name)
        notebook = env.get("JPY_SESSION_NAME") or ""
        label = Path(notebook).name if notebook else self.kernel_spec.display_name
        try:
            sched = await asyncio.to_thread(self._client)
            handle = await asyncio.to_thread(self._submit, sched, notebook, label)
        except DlschedError as error:
            if isinstance(error, KernelLeaseError):
                raise
            raise KernelLeaseError(
                f"this kernel's GPU lease could not be queued: {error}"
            ) from error
        self.job_id = handle.id
        limit = duration_or_none(self.wait_limit, "wait_limit")
        deadline = None if limit is None else time.time() + limit
        said = None
        pause, asked_at, waited_from = 0.01, 0.0, time.time()
        try:
            while True:
                grant = control.read(self.folder, "grant.json")
                if grant is not None and grant.get("job_id") == self.job_id:
                    self.log.info("GPU lease %s granted: %s", self.job_id, grant.get("env"))
                    return grant
                # the grant file is read every 10 ms while a grant is likely (the first
                # 2 s: it comes in about 0.1 s), the queue (an agent round trip) 4 times a
                # second: a grant polled at a growing pause was seen 5-60 ms late
                if time.monotonic() - asked_at < max(0.25, pause):
                    await asyncio.sleep(pause)
                    continue
                asked_at = time.monotonic()
                info = await asyncio.to_thread(sched.info, self.job_id)
                if info.state in TERMINAL:
                    how = f" ({info.reason})" if info.reason else ""
                    raise KernelLeaseError(
                        f"this kernel's GPU lease {self.job_id} was {info.state} while it "
                        f"waited{how}: the kernel was not started"
                    )
                if info.waiting and info.waiting != said:
                    said = info.waiting
                    self.log.info("GPU kernel waits in line (lease %s): %s", self.job_id, said)
                if deadline is not None and time.time() > deadline:
                    await asyncio.to_thread(sched.cancel, self.job_id)
                    raise KernelLeaseError(
                        f"no GPU for this kernel within {self.wait_limit} "
                        f"({info.waiting or info.state}); its lease {self.job_id} was "
                        "cancelled. Try again later or install the kernelspec with a longer "
                        "--wait-limit"
                    )
                # a long wait is read twice a second
                if time.time() - waited_from > 2.0:
                    pause = min(0.5, pause * 1.5)
                await asyncio.sleep(pause)
        except (asyncio.CancelledError, KeyboardInterrupt):
            await asyncio.to_thread(self._cancel_quietly)
            raise

    def _submit(self, sched: Any, notebook: str, label: str) -> Any:
        """Queue the lease: a job of kind ``kernel`` whose job process runs ``lease.hold``."""
        from .lease import hold

        assert self.folder is not None
        kwargs = {
            "home": str(sched.home),
            "idle": duration_or_none(self.idle, "idle"),
            "grace": duration_or_none(self.idle_grace, "idle_grace") or 0.0,
            "gpus": _gpu_count(self.gpus),
            "server_pid": os.getpid(),
        }
        request = {
            "gpus": self.gpus,
            "gpu_mem": self.gpu_mem,
            "cpus": self.cpus,
            "mem": self.mem,
            "priority": self.priority,
        }
        origin, name = notebook or f"kernel {self.kernel_id}", f"kernel · {label}"
        # what a suspended kernel's next cell queues again (resume.py)
        control.write(
            self.folder,
            "lease.json",
            {
                "home": os.environ.get("DLSCHED_HOME") if self.home is None else self.home,
                "hold": kwargs,
                "request": request,
                "origin": origin,
                "name": name,
            },
        )
        return sched.submit_payload(
            "kernel",
            {"fn": hold, "args": (str(self.folder),), "kwargs": kwargs},
            default_name="kernel",
            origin_text=origin,
            name=name,
            **request,
        )

    def _cancel_quietly(self) -> None:
        if self.job_id is None:
            return
        try:
            info = self._client().info(self.job_id)
            if info.state not in TERMINAL:
                self._client().cancel(self.job_id)
        except Exception as error:
            self.log.warning("could not cancel GPU lease %s: %s", self.job_id, error)

    # -- the provisioner's life cycle ------------------------------------------------------

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        env = dict(kwargs.get("env") or os.environ)
        if env.get(JOB_ID_ENV) and self.job_id is None:
            # a job's process starts this kernel (a notebook job runs its notebook's GPU
            # kernelspec): the job holds its GPUs already, and its grant is in the kernel's
            # environment; a lease would ask the pool for them a second time and wait on
            # the job itself
            self._in_job = True
            return dict(await super().pre_launch(**kwargs))
        try:
            alive = await self._lease_alive()
        finally:
            self._restart_asked = False
        if alive:
            assert self.folder is not None
            grant = control.read(self.folder, "grant.json") or {}
        else:
            grant = await self._acquire(env)
        try:
            kwargs = await super().pre_launch(**kwargs)
        except BaseException:
            self._release()  # no kernel will use the grant
            raise
        kernel_env = kwargs["env"]
        for name in control.GRANT_ENV:
            kernel_env.pop(name, None)
        kernel_env.pop("DLSCHED_JOB_ID", None)  # the kernel is not the job: it submits them
        kernel_env.update(grant.get("env") or {})
        kernel_env[control.LEASE_ENV] = str(self.folder)
        kernel_env["DLSCHED_KERNEL_JOB"] = str(self.job_id)
        cmd = list(kwargs["cmd"])
        if not any(ACTIVITY_EXTENSION in part for part in cmd):
            cmd.append(f"--ext={ACTIVITY_EXTENSION}")
        kwargs["cmd"] = cmd
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        if self._in_job:
            return await super().launch_kernel(cmd, **kwargs)
        try:
            info = self._hand_to_spare(cmd, kwargs)
            if info is None:
                info = await super().launch_kernel(cmd, **kwargs)
        except BaseException:
            self._release()  # the kernel could not be started: its GPUs go back now
            raise
        assert self.folder is not None
        control.write(
            self.folder,
            "kernel.json",
            {"pid": self.pid, "server_pid": os.getpid(), "started": time.time()},
        )
        self._next_spare(cmd, kwargs)
        return info

    # -- warm kernels (spares.py) -----------------------------------------------------------

    def _spare_key(self, cmd: list[str], kwargs: dict[str, Any]) -> spares.Key | None:
        if not spares.enabled() or kwargs.get("independent"):
            return None
        if kwargs.get("stdout") is not None or kwargs.get("stderr") is not None:
            return None  # a spare's output goes where the server's goes, as by default
        return spares.key_of(str(getattr(self.parent, "kernel_name", "") or "?"), cmd)

    def _kernel_env(self, kwargs: dict[str, Any]) -> dict[str, str]:
        # what jupyter_client's launcher gives a kernel it spawns
        return {**(kwargs.get("env") or os.environ), "JPY_PARENT_PID": str(os.getpid())}

    def _hand_to_spare(self, cmd: list[str], kwargs: dict[str, Any]) -> KernelConnectionInfo | None:
        """The waiting spare becomes this kernel: None when there is none to use."""
        key = self._spare_key(cmd, kwargs)
        if key is None:
            return None
        env = self._kernel_env(kwargs)
        spare = spares.take(key, env, self.log)
        cwd = kwargs.get("cwd") or os.getcwd()  # where a spawned kernel would run
        if spare is None or not spares.hand_over(
            spare, spares.kernel_argv(key, cmd), env, str(cwd)
        ):
            return None
        self.process = spare.process
        self.pid = spare.process.pid
        self.pgid = spare.process.pid  # a session (and group) of its own, as spawned kernels
        self.cwd = cwd
        self.log.info("GPU kernel %s: the spare kernel pid %s took it", self.kernel_id, self.pid)
        return self.connection_info

    def _next_spare(self, cmd: list[str], kwargs: dict[str, Any]) -> None:
        key = self._spare_key(cmd, kwargs)
        if key is not None:
            spares.ensure(key, self._kernel_env(kwargs), self.log)

    def _release(self) -> None:
        if self.folder is not None:
            control.mark(self.folder, "released")

    async def shutdown_requested(self, restart: bool = False) -> None:
        self._restart_asked = restart
        if restart and self.folder is not None:
            control.mark(self.folder, "restarting")
        await super().shutdown_requested(restart=restart)

    async def cleanup(self, restart: bool = False) -> None:
        if self.folder is not None:
            if restart:
                control.mark(self.folder, "restarting")
            else:
                if control.read(self.folder, "ended.json") is not None:
                    # the lease ended before the kernel was shut down: nobody uses the folder
                    shutil.rmtree(self.folder, ignore_errors=True)
                else:
                    control.mark(self.folder, "released")  # the lease removes the folder
                await asyncio.to_thread(self._end_lease)
        await super().cleanup(restart=restart)

    def _end_lease(self) -> None:
        """The kernel is gone for good: the lease ends itself on ``released``; one still
        waiting in line (a start given up) is cancelled."""
        if self.job_id is None:
            return
        try:
            if self._client().info(self.job_id).state == "queued":
                self._client().cancel(self.job_id)
        except Exception as error:
            self.log.warning("could not end GPU lease %s: %s", self.job_id, error)
        if self._scheduler is not None:
            self._scheduler.close()
            self._scheduler = None

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super().get_provisioner_info()
        info.update({"dlsched_job": self.job_id, "dlsched_folder": str(self.folder or "")})
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super().load_provisioner_info(provisioner_info)
        self.job_id = provisioner_info.get("dlsched_job")
        folder = provisioner_info.get("dlsched_folder")
        self.folder = Path(folder) if folder else None
