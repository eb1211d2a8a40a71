"""Real servers the tests start on loopback, shared by a session (fixtures in tests/conftest.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # it answers, even if not 200
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"{url}: the server exited with {process.returncode}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: no answer within {timeout} s") from None
            time.sleep(0.2)


@contextmanager
def s3_server(log: Path) -> Iterator[str]:
    """moto's standalone S3-compatible server on a free loopback port; yields its endpoint URL."""
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=sink, stderr=subprocess.STDOUT
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_up(url, process)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)
