"""Where agent programs and tools run on an HPC node: no Docker, no root. A plain subprocess
with resource limits, a scratch folder and (where the kernel lets us) no network; or an
Apptainer/Singularity container when ``apptainer`` is on the node.

Data in: a command, its environment and stdin, a wall-clock limit and a cancel check. Data out:
:class:`Finished` (exit code, output, why it was stopped). The whole process group is killed at
the limit or on cancel, so nothing a sandbox started outlives it.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Mapping, Optional, Sequence

from rft.errors import WorkflowError

POLL_S = 0.05  # how often a running sandbox checks its cancel flag
MAX_OUTPUT_CHARS = 1_000_000  # stdout/stderr kept per run (an agent's chatter is cut)


@dataclass(frozen=True)
class Limits:
    """What a sandboxed run may use (``workflow_args.sandbox``)."""

    backend: str = "auto"  # auto (apptainer if image is set and found) | subprocess | apptainer
    image: Optional[str] = None  # apptainer: the .sif image
    memory_mb: Optional[int] = 4096  # address space (RLIMIT_AS); None: unlimited
    cpu_s: Optional[int] = None  # CPU seconds (RLIMIT_CPU); None: unlimited
    max_file_mb: Optional[int] = 1024  # largest file it may write (RLIMIT_FSIZE)
    network: bool = True  # False: no network (an agent needs it to reach the endpoint)

    @classmethod
    def from_args(cls, args: Mapping[str, object], where: str) -> "Limits":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise WorkflowError(f"{where}: unknown key(s) {unknown}; valid: {sorted(known)}")
        limits = cls(**args)  # type: ignore[arg-type]
        if limits.backend not in ("auto", "subprocess", "apptainer"):
            raise WorkflowError(
                f"{where}.backend: {limits.backend!r}; use auto, subprocess or apptainer"
            )
        if limits.backend == "apptainer" and not limits.image:
            raise WorkflowError(f"{where}: backend apptainer needs image: /path/to/image.sif")
        return limits


@dataclass(frozen=True)
class Finished:
    returncode: Optional[int]  # None: it was stopped
    stdout: str
    stderr: str
    stopped: Optional[str] = None  # why it was stopped (limit, cancel), else None
    seconds: float = 0.0


@lru_cache(maxsize=1)
def apptainer() -> Optional[str]:
    """The apptainer (or singularity) executable on this node, if any."""
    return shutil.which("apptainer") or shutil.which("singularity")


@lru_cache(maxsize=1)
def can_unshare_network() -> bool:
    """Whether ``unshare --net`` works here (root, or unprivileged user namespaces)."""
    tool = shutil.which("unshare")
    if tool is None:
        return False
    for argv in ([tool, "--net", "true"], [tool, "--user", "--map-root-user", "--net", "true"]):
        try:
            if subprocess.run(argv, capture_output=True, timeout=10).returncode == 0:
                return True
        except (OSError, subprocess.TimeoutExpired):
            pass
    return False


def _no_network_prefix() -> list[str]:
    tool = shutil.which("unshare") or "unshare"
    if os.geteuid() == 0:
        return [tool, "--net"]
    return [tool, "--user", "--map-root-user", "--net"]


def backend_of(limits: Limits) -> str:
    """The backend a run uses: ``auto`` is apptainer when an image is set and it exists."""
    if limits.backend == "auto":
        return "apptainer" if limits.image and apptainer() else "subprocess"
    return limits.backend


def command(argv: Sequence[str], limits: Limits, scratch: str) -> list[str]:
    """The command line that runs ``argv`` under ``limits`` in ``scratch`` (its working dir)."""
    if backend_of(limits) == "apptainer":
        exe = apptainer()
        if exe is None:
            raise WorkflowError(
                "sandbox backend apptainer: neither apptainer nor singularity is on this node's "
                "PATH (module load apptainer?), or use backend: subprocess"
            )
        net = [] if limits.network else ["--net", "--network", "none"]
        return [
            exe,
            "exec",
            "--containall",
            "--bind",
            f"{scratch}:/scratch",
            "--pwd",
            "/scratch",
            *net,
            str(limits.image),
            *argv,
        ]
    if not limits.network:
        if not can_unshare_network():
            raise WorkflowError(
                "sandbox network: false needs `unshare --net` (root or user namespaces), which "
                "this node does not allow; set network: true or use backend: apptainer"
            )
        return [*_no_network_prefix(), *argv]
    return list(argv)


def _preexec(limits: Limits) -> Callable[[], None]:
    def apply() -> None:
        for which, value in (
            (resource.RLIMIT_AS, limits.memory_mb and limits.memory_mb * 2**20),
            (resource.RLIMIT_CPU, limits.cpu_s),
            (resource.RLIMIT_FSIZE, limits.max_file_mb and limits.max_file_mb * 2**20),
        ):
            if value:
                resource.setrlimit(which, (value, value))

    return apply


def run_sandboxed(
    argv: Sequence[str],
    limits: Limits,
    *,
    env: Mapping[str, str],
    timeout_s: float,
    stdin: str = "",
    cancelled: Callable[[], Optional[str]] = lambda: None,
) -> Finished:
    """Run ``argv`` sandboxed in a fresh scratch folder (removed after); stop its whole process
    group after ``timeout_s`` or as soon as ``cancelled()`` says why."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rft-sandbox-") as scratch:
        env = {**env, "HOME": scratch, "TMPDIR": scratch}
        if backend_of(limits) == "apptainer":  # --containall passes no variable but these
            env.update({f"APPTAINERENV_{k}": v for k, v in env.items()})
        with (
            tempfile.TemporaryFile("w+") as out,
            tempfile.TemporaryFile("w+") as err,
        ):
            proc = subprocess.Popen(
                command(argv, limits, scratch),
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=scratch,
                env=env,
                text=True,
                start_new_session=True,  # its own process group: killed as a whole
                preexec_fn=_preexec(limits),
            )
            stopped = _wait(proc, stdin, start + timeout_s, timeout_s, cancelled)
            out.seek(0)
            err.seek(0)
            return Finished(
                None if stopped else proc.returncode,
                out.read(MAX_OUTPUT_CHARS),
                err.read(MAX_OUTPUT_CHARS),
                stopped,
                time.monotonic() - start,
            )


def _wait(
    proc: subprocess.Popen,
    stdin: str,
    deadline: float,
    timeout_s: float,
    cancelled: Callable[[], Optional[str]],
) -> Optional[str]:
    try:
        if proc.stdin is not None:
            proc.stdin.write(stdin)
            proc.stdin.close()
    except BrokenPipeError:
        pass  # it exited without reading its input
    stopped = None
    while proc.poll() is None:
        why = cancelled()
        if why or time.monotonic() > deadline:
            stopped = why or f"ran past its limit of {timeout_s:g}s"
            break
        time.sleep(POLL_S)
    if stopped is not None or _group_alive(proc.pid):
        _kill_group(proc)
    return stopped


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
