"""Real servers the tests start on loopback: moto's S3 (plain, or checking credentials), a proxy that fails the
requests it is told to, `mlflow server`. Their fixtures, one each and shared by the session where they are safe to
share: tests/conftest.py (S3) and tests/e2e/conftest.py (mlflow, the hub of tests/hub_server.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

BIN = Path(sys.executable).parent
S3_SECRET = "s3-secret-canary-7e57c0de"  # the secret key of the `aws` fixture's variables: must reach no message


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
def s3_server(log: Path, environ: dict[str, str] | None = None) -> Iterator[str]:
    """moto's standalone S3-compatible server on a free loopback port; yields its endpoint URL."""
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=environ,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_up(url, process)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)


def aws_environment(endpoint: str, secret: str) -> dict[str, str]:
    """The AWS_* variables a user sets for an S3-compatible server at ``endpoint``; botocore's own retries off (the
    retries a test sees are the store's) and no credentials or metadata from elsewhere."""
    return {
        "AWS_ACCESS_KEY_ID": "mlm-tests",
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        "AWS_CONFIG_FILE": "/nonexistent",
    }


def s3_server_authenticating(log: Path, free_actions: int) -> AbstractContextManager[str]:
    """moto's S3 server checking credentials after its first ``free_actions`` requests (moto's
    INITIAL_NO_AUTH_ACTION_COUNT: spend them creating an IAM user and its access key); yields its endpoint URL."""
    return s3_server(log, {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(free_actions)})


@contextmanager
def s3_server_with_user(log: Path) -> Iterator[tuple[str, str, str]]:
    """A moto server that checks credentials, with one IAM user allowed everything: yields (endpoint, that user's
    access key id, its secret)."""
    import boto3

    with s3_server_authenticating(log, free_actions=4) as url:
        iam = boto3.client(
            "iam", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
        )
        iam.create_user(UserName="trainer")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="trainer", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        yield url, key["AccessKeyId"], key["SecretAccessKey"]


@contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """`mlflow server` with a SQLite store and proxied artifacts under ``root``, in its own process group (it starts
    a uvicorn child); its job runner, a pool of consumer processes the tests have no use for, is off. Yields its
    URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "art")]
    command += ["--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with (root / "server.log").open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while True:
                assert server.poll() is None, (root / "server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "mlflow server did not answer /health in 180 s"
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                        if answer.status == 200:
                            break
                except OSError:
                    time.sleep(0.5)
            yield url
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


class FlakyProxy:
    """What :func:`flaky_proxy` serves: ``fail(n, method, how, after)`` lets ``after`` requests of ``method``
    through, then makes the next ``n`` fail: answered 500 (``how="500"``, an S3 InternalError), 503 SlowDown
    (``"503"``) or with the connection closed before any answer (``"close"``). ``log`` lists every request that
    reached it as (method, path with query, failed)."""

    def __init__(self) -> None:
        import threading

        self.url = ""
        self.lock = threading.Lock()
        self.failures: dict[str, list[str | None]] = {}
        self.where: dict[str, str] = {}
        self.log: list[tuple[str, str, bool]] = []

    def fail(self, n: int, method: str = "PUT", how: str = "500", after: int = 0, where: str = "") -> None:
        """``where``: only requests whose path holds it count (and fail); the others pass."""
        with self.lock:
            self.failures[method] = [None] * after + [how] * n
            self.where[method] = where

    def heal(self) -> None:
        with self.lock:
            self.failures.clear()

    @property
    def failed(self) -> int:
        return sum(failed for _, _, failed in self.log)

    def take(self, method: str, path: str) -> str | None:
        with self.lock:
            pending = self.failures.get(method)
            how = pending.pop(0) if pending and self.where.get(method, "") in path else None
            self.log.append((method, path, how is not None))
            return how


S3_ERROR = '<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message></Error>'


@contextmanager
def flaky_proxy(upstream: str) -> Iterator[FlakyProxy]:
    """A plain HTTP proxy on loopback in front of ``upstream`` (an S3 endpoint) that fails the requests it is told
    to (:class:`FlakyProxy`), forwarding the others unchanged; a real server failing mid-upload for retry tests."""
    import http.client
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlsplit

    state = FlakyProxy()
    target = urlsplit(upstream)
    hop_by_hop = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            return

        def _body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline().strip():  # trailers
                            pass
                        break
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _relay(self) -> None:
            how = state.take(self.command, self.path)
            if how == "close":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            body = self._body()
            if how is not None:
                code, name = (503, "SlowDown") if how == "503" else (500, "InternalError")
                payload = S3_ERROR.format(code=name, message=f"{name} (injected by the test proxy)").encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(payload)
                self.close_connection = True
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in hop_by_hop}
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                headers["Content-Length"] = str(len(body))
            connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                data = answer.read()
            finally:
                connection.close()
            self.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in hop_by_hop:
                    self.send_header(key, value)
            # A HEAD's answer says how long the object is: its Content-Length is the upstream's, not the empty body's.
            self.send_header(
                "Content-Length", answer.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
            )
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="flaky-proxy", daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
