"""Checks on the world outside the request, made before any rank starts: prompt files, the output
path, the folder for temporary files, the Hugging Face Hub. Each failure is a ConfigError that names
the flag and the fix."""
from __future__ import annotations

import errno
import os
import socket
import tempfile
from urllib.parse import urlparse

from .errors import ConfigError

HUB_PROBE_SECONDS = 3.0  # without it an unreachable Hub costs far longer in retries (docs/install.md)


def read_prompt_file(path: str) -> list[str]:
    """One prompt per line, blank lines skipped; an unreadable, non-UTF-8 or blank file is refused
    (never a silent fall-back to the built-in prompt)."""
    try:
        with open(path, encoding="utf-8") as f:
            prompts = [line.strip() for line in f if line.strip()]
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--prompt-file {path}: not UTF-8 text (byte {exc.start}: {exc.reason}); save it as "
                          "UTF-8.") from None
    except OSError as exc:
        raise ConfigError(f"cannot read --prompt-file: {exc}") from None
    if not prompts:
        raise ConfigError(f"--prompt-file {path} holds no prompt (it is empty or blank): write one prompt per "
                          "line, or use --prompt TEXT.")
    return prompts


def check_output_writable(pattern: str, count: int) -> None:
    """Each output path can be written: not a folder, not under a regular file, in a writable folder."""
    checked = set()
    for index in range(count):
        path = os.path.abspath(pattern.replace("{i}", str(index)))
        if os.path.isdir(path):
            raise ConfigError(f"--output {pattern}: {path} is a folder; name a file inside it, e.g. "
                              f"--output {os.path.join(pattern, 'out.png')}.")
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise ConfigError(f"--output {pattern}: {path} exists and cannot be overwritten; choose another name.")
        folder = os.path.dirname(path)
        if folder in checked:
            continue
        checked.add(folder)
        existing = folder
        while not os.path.exists(existing):  # save_images creates the missing folders
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            raise ConfigError(f"--output {pattern}: {existing} is a file, so no folder can be made under it; "
                              "choose another output path.")
        try:  # the real test of writability (permissions, read-only file systems); leaves nothing behind
            with tempfile.TemporaryFile(dir=existing):
                pass
        except OSError as exc:
            raise ConfigError(f"--output {pattern}: cannot write in {existing} ({exc.strerror}); choose a writable "
                              "folder.") from None


def check_hub_reachable(model: str, timeout: float = HUB_PROBE_SECONDS) -> None:
    """A model that must come from the Hub fails within `timeout` seconds when the Hub cannot be reached."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return  # only the proxy knows whether the Hub is reachable; let huggingface_hub find out
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(
            f"model {model!r} is not a local folder nor in the Hugging Face cache, and {host} cannot be reached "
            f"({exc.strerror or type(exc).__name__}, within {timeout:g} s): connect to the network, pass a folder "
            "saved with save_pretrained, or set HF_HUB_OFFLINE=1 to use only the cache.") from None


TEMP_FOLDER_MIN_FREE = 1 << 20
"""A temp folder with less free space counts as full: the ranks' multiprocessing and torch files need some."""


def temp_folder_candidates() -> list[tuple[str, str]]:
    """(folder, how it was chosen), in the order Python's tempfile tries them on POSIX."""
    named = [(os.environ[k], f"{k}={os.environ[k]}") for k in ("TMPDIR", "TEMP", "TMP") if os.environ.get(k)]
    fixed = [(d, d) for d in ("/tmp", "/var/tmp", "/usr/tmp")]
    try:
        here = os.getcwd()
        fixed.append((here, f"the current folder {here}"))
    except OSError:
        pass
    return named + fixed


def _why_unusable(folder: str) -> str | None:
    """None if a temp file can be written in `folder`, else what is wrong with it."""
    if not os.path.isdir(folder):
        return "is not a folder" if os.path.exists(folder) else "does not exist"
    try:
        fd, path = tempfile.mkstemp(prefix=".meshdit-probe-", dir=folder)
        try:
            os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
            os.unlink(path)
        stat = os.statvfs(folder)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"is full ({errno.errorcode[exc.errno]}: {exc.strerror})"
        return f"cannot be written ({exc.strerror or exc})"
    free = stat.f_bavail * stat.f_frsize
    return f"is full ({free // 1024} KiB free)" if free < TEMP_FOLDER_MIN_FREE else None


def check_temp_folder() -> str | None:
    """The folder for temporary files, checked before any rank starts (the ranks need it: multiprocessing,
    torch; with none, each fails with "No usable temporary directory found"). Raises ConfigError naming
    every candidate and what is wrong with it when none can be used; returns a warning when the first
    candidate cannot (tempfile silently falls back to the next), else None."""
    problems = []
    for folder, label in temp_folder_candidates():
        why = _why_unusable(folder)
        if why is None:
            if not problems:
                return None
            return (f"{'; '.join(problems)}: temporary files go to {folder} instead. Free space there, or set TMPDIR "
                    "to a folder with free space.")
        problems.append(f"{label} {why}")
    raise ConfigError(f"no folder can hold temporary files: {'; '.join(problems)}. Free space in one of them, or set "
                      "TMPDIR to a folder with free space, e.g. TMPDIR=$HOME/tmp (mkdir it first).")
