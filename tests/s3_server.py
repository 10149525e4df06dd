"""A real S3 API on localhost for the storage tests: moto's server mode (which Ray's own storage tests use), started
once per session as a subprocess, and a fresh bucket per test with the standard AWS environment pointing at it.

Tests reach it exactly as a user's run reaches S3: `--output s3://bucket/run`, AWS_ENDPOINT_URL and credentials
from the environment, pyarrow's S3 client. A test module takes its fixtures with `pytest_plugins = ["s3_server"]`.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pyarrow.fs as pafs
import pytest

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """The endpoint URL of a moto S3 server that lives for the session."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, "moto's S3 server exited at start"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "moto's S3 server did not start"
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
def s3(s3_server, monkeypatch) -> str:
    """`s3://<a new bucket>`, with AWS_ENDPOINT_URL and credentials set for this test."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    bucket = f"raylm-{uuid.uuid4().hex[:12]}"
    pafs.S3FileSystem(endpoint_override=s3_server, allow_bucket_creation=True).create_dir(bucket)
    return f"s3://{bucket}"
