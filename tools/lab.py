"""Serve the book's notebooks in JupyterLab from .venv, offline: what `make lab` runs.

    .venv/bin/python tools/lab.py [--port 8888] [--token TOKEN] [--no-browser] [notebooks]

It registers the kernel "lnbook" (this Python, which has lnbook installed) in this environment,
takes the port asked for or, when that one is taken, the next free one and says so, and starts
JupyterLab on the folder with nothing fetched from outside (no news feed, no update check, no
extension catalogue). Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

KERNEL = "lnbook"
KERNEL_DISPLAY_NAME = "Python 3 (lnbook)"
CONFIG = Path(__file__).resolve().parent / "lab_config"
# JupyterLab's settings for a machine with no outside network: nothing asks the internet.
OFFLINE = ["--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly"]


def register_kernel(prefix: str = sys.prefix) -> Path:
    """Install the kernel spec ``lnbook``, running this Python, under ``prefix``; return its folder."""
    from ipykernel.kernelspec import install

    return Path(install(kernel_name=KERNEL, display_name=KERNEL_DISPLAY_NAME, prefix=prefix))


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def choose_port(wanted: int, tries: int = 50, host: str = "127.0.0.1") -> int:
    """``wanted`` when it is free, else the next free port above it, saying which one is taken."""
    if not 0 < wanted < 65536:
        raise SystemExit(f"--port must be between 1 and 65535, got {wanted}")
    for port in range(wanted, min(wanted + tries, 65536)):
        if port_is_free(port, host):
            if port != wanted:
                print(f"Port {wanted} is taken (another JupyterLab?); using port {port} instead.", flush=True)
            return port
    raise SystemExit(f"Ports {wanted} to {port} are all taken; pass a free one: make lab LAB_PORT=...")


def lab_environment() -> dict[str, str]:
    """This process's environment with tools/lab_config/ on Jupyter's configuration path: its
    page_config.json turns off the plugin that asks for the news feed and update checks."""
    paths = [str(CONFIG), *filter(None, [os.environ.get("JUPYTER_CONFIG_PATH")])]
    return {**os.environ, "JUPYTER_CONFIG_PATH": os.pathsep.join(paths)}


def lab_command(folder: Path, port: int, token: str | None = None, browser: bool = True) -> list[str]:
    """The command line that serves ``folder`` with this Python's JupyterLab on 127.0.0.1:``port``."""
    command = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={folder}", "--ip=127.0.0.1", f"--port={port}",
               "--ServerApp.port_retries=0",
               f"--MappingKernelManager.default_kernel_name={KERNEL}", *OFFLINE]
    if token is not None:
        command.append(f"--IdentityProvider.token={token}")
    if not browser:
        command.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # a container's root user: Jupyter refuses it unless asked
        command.append("--allow-root")
    return command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=Path(__file__).resolve().parents[1] / "notebooks")
    parser.add_argument("--port", type=int, default=8888, help="the port to serve on, or the next free one")
    parser.add_argument("--token", help="the token to log in with (default: a new random one, printed)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        raise SystemExit(f"folder: {args.folder} is not a folder")
    spec = register_kernel()
    print(f"Kernel {KERNEL!r} ({KERNEL_DISPLAY_NAME}) registered in {spec}; pick it under Kernel > Change Kernel.")
    command = lab_command(args.folder.resolve(), choose_port(args.port), args.token, not args.no_browser)
    os.execve(command[0], command, lab_environment())  # JupyterLab takes over this process, and Ctrl-C is its own


if __name__ == "__main__":
    sys.exit(main())
