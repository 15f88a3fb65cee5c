"""`meshdit generate` as a user runs it, in its own session (so a test can signal the whole group and find
every process it left), with its own TMPDIR; helpers to wait for its output and check what it left."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_cli(args: list[str], tmp: Path, **env) -> subprocess.Popen:
    (tmp / "tmpdir").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp / "tmpdir"), "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen([sys.executable, "-m", "meshdit", "generate", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # as from a terminal: a suite started as a background job passes SIGINT down ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def read_until(proc: subprocess.Popen, text: str, timeout: float) -> str:
    """stderr read until `text` appears (or the process ends, or the time is up); what was read."""
    seen, deadline = "", time.monotonic() + timeout
    os.set_blocking(proc.stderr.fileno(), False)
    while text not in seen and time.monotonic() < deadline and proc.poll() is None:
        chunk = os.read(proc.stderr.fileno(), 65536) if _readable(proc) else b""
        seen += chunk.decode(errors="replace")
    os.set_blocking(proc.stderr.fileno(), True)
    return seen


def _readable(proc) -> bool:
    import select

    return bool(select.select([proc.stderr], [], [], 0.1)[0])


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """(exit status, stdout, stderr); the session is killed if it outlives `timeout`."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out, err


def processes_left(proc: subprocess.Popen, wait: float = 10) -> str:
    """The run's session's live processes (`ps` lines) once there are none or `wait` s have passed. Zombies
    are not counted: they have ended, and an orphan's is reaped by init, which may take its time."""
    deadline = time.monotonic() + wait
    while True:
        listing = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-s", str(proc.pid)], capture_output=True,
                                 text=True).stdout
        left = "".join(line + "\n" for line in listing.splitlines() if not line.split()[1].startswith("Z"))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def files_left(tmp: Path) -> list[str]:
    """What the run left in its TMPDIR and in /dev/shm (the shared cast of a multi-rank load)."""
    return sorted(os.listdir(tmp / "tmpdir"))
