"""Serve the book's notebooks in JupyterLab from .venv, offline: what `make lab` runs.

    .venv/bin/python tools/lab.py [--port 8888] [--copies lab] [--token TOKEN] [--no-browser]

JupyterLab serves working copies of the chapters (``lab/notebooks/``, ignored by git; a copy
the reader has changed is never replaced), so that running and saving them never changes the
committed notebooks, whose outputs the book shows and nbval compares. It registers this Python as the
kernel "Python 3 (lnbook)" for the user's other Jupyter front ends; takes the port asked for or,
when that one is taken, the next free one and says so; and starts JupyterLab with nothing
fetched from outside (no news feed, no update check, no extension catalogue). A second run on
the same copies gives the running server's address instead. Ctrl-C twice stops it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIES = ROOT / "lab"  # the working copies, ignored by git
KERNEL = "lnbook"
KERNEL_DISPLAY_NAME = "Python 3 (lnbook)"
CONFIG = Path(__file__).resolve().parent / "lab_config"
FIRST_CHAPTER = "notebooks/00_quickstart.ipynb"
# JupyterLab's settings for a machine with no outside network: nothing asks the internet.
OFFLINE = ["--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly"]


def register_kernel() -> Path:
    """Install the kernel spec ``lnbook``, running this Python, for this user; return its folder."""
    from ipykernel.kernelspec import install

    return Path(install(kernel_name=KERNEL, display_name=KERNEL_DISPLAY_NAME, user=True))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def working_copies(copies: Path, source: Path = ROOT / "notebooks") -> list[str]:
    """Copy every notebook of ``source`` that ``copies``/notebooks lacks, and replace a copy the
    reader has not changed when its chapter has changed (``copies``/sources.json keeps the hash
    each copy was made with). A changed copy is the reader's and stays: for it, this returns a
    notice. ``copies``/benchmarks links to the repository's, so that the chapters'
    ``../benchmarks/...`` paths resolve as they do from notebooks/."""
    into = copies / "notebooks"
    into.mkdir(parents=True, exist_ok=True)
    benchmarks = copies / "benchmarks"
    if not benchmarks.exists() and (source.parent / "benchmarks").is_dir():  # missing, or left dangling by a move
        benchmarks.unlink(missing_ok=True)
        benchmarks.symlink_to(os.path.relpath(source.parent / "benchmarks", copies), target_is_directory=True)
    manifest = copies / "sources.json"
    made_from = json.loads(manifest.read_text()) if manifest.exists() else {}
    notices = []
    for chapter in sorted(source.glob("*.ipynb")):
        copy, now = into / chapter.name, digest(chapter)
        if copy.exists() and made_from.get(chapter.name) != now:
            if digest(copy) != made_from.get(chapter.name):  # the reader's work: never overwritten
                notices.append(f"{chapter.relative_to(source.parent)} has changed, and so has your copy {copy}: "
                               f"rename the copy (e.g. to {chapter.stem}.mine.ipynb) to keep it and get the new version.")
                continue
            copy.unlink()
        if not copy.exists():
            shutil.copyfile(chapter, copy)
            made_from[chapter.name] = now
    manifest.write_text(json.dumps(made_from, indent=1, sort_keys=True))
    return notices


def running_server(copies: Path) -> dict | None:
    """The Jupyter server of this user that already serves ``copies``, if one runs."""
    from jupyter_server.serverapp import list_running_servers

    return next((info for info in list_running_servers() if Path(info["root_dir"]).resolve() == copies.resolve()), None)


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
    """The command line that serves ``folder`` with this Python's JupyterLab on 127.0.0.1:``port``,
    opening chapter 00."""
    command = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={folder}", "--ip=127.0.0.1", f"--port={port}",
               "--ServerApp.port_retries=0", f"--LabApp.default_url=/lab/tree/{FIRST_CHAPTER}",
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
    parser.add_argument("--port", type=int, default=8888, help="the port to serve on, or the next free one")
    parser.add_argument("--copies", type=Path, default=COPIES, help="where the working copies live")
    parser.add_argument("--token", help="the token to log in with (default: a new random one, printed)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser")
    args = parser.parse_args(argv)
    serving = running_server(args.copies)
    if serving is not None:  # two servers saving the same copies would overwrite each other's work
        print(f"JupyterLab already serves {args.copies.resolve()}: open {serving['url']}lab?token={serving['token']}")
        return 0
    for notice in working_copies(args.copies):
        print(notice)
    print(f"Working copies of the chapters: {args.copies.resolve() / 'notebooks'} (the committed ones do not change).")
    print(f"Kernel: 'Python 3 (ipykernel)', this Python; also registered as {KERNEL_DISPLAY_NAME!r} for other Jupyter "
          f"front ends in {register_kernel()}.", flush=True)
    command = lab_command(args.copies.resolve(), choose_port(args.port), args.token, not args.no_browser)
    os.execve(command[0], command, lab_environment())  # JupyterLab takes over this process, and Ctrl-C is its own


if __name__ == "__main__":
    sys.exit(main())
