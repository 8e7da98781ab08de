"""The daemon's queued log writes: every line on disk, with or without stop_logging()."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from localllm.settings import Settings

# Logs from three threads and the access logger, then leaves without stop_logging():
# what the interpreter's exit writes is all the daemon's log gets.
_LOG_AND_EXIT = """
import logging, threading
from localllm.settings import Settings
from localllm.daemon.server import setup_logging
path = setup_logging(Settings.from_env())
def many(tag):
    for i in range(500):
        logging.getLogger("localllm.test").info("%s line %d", tag, i)
threads = [threading.Thread(target=many, args=(t,)) for t in "abc"]
for t in threads: t.start()
for t in threads: t.join()
from localllm.daemon.app import ACCESS_LOG
ACCESS_LOG.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:9", "POST", "/v1/chat/completions", "1.1",
    200)
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("localllm.daemon").exception("failed %s", "here")
print(path)
"""


def test_queued_log_lines_are_all_on_disk_after_an_exit_without_stop(home: Path) -> None:
    env = {**os.environ, "LOCALLLM_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-c", _LOG_AND_EXIT], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = Path(done.stdout.strip()).read_text().splitlines()
    for tag in "abc":
        assert [line.split(": ", 1)[1] for line in lines if f": {tag} line " in line] == [
            f"{tag} line {i}" for i in range(500)
        ]
    assert any(
        ' INFO uvicorn.access: 127.0.0.1:9 - "POST /v1/chat/completions HTTP/1.1" 200' in line
        for line in lines
    )
    failed = next(i for i, line in enumerate(lines) if "ERROR localllm.daemon: failed here" in line)
    assert "ZeroDivisionError" in "\n".join(lines[failed:])


@pytest.fixture
def own_loggers() -> Iterator[None]:
    """The loggers setup_logging() takes over, given back as they were (other tests of this
    process read them with caplog)."""
    from localllm.daemon.app import ACCESS_LOG

    names = ("localllm", "uvicorn", "uvicorn.error")
    saved = [
        (logger, logger.handlers[:], logger.level, logger.propagate)
        for logger in (*map(logging.getLogger, names), ACCESS_LOG)
    ]
    raise_exceptions = logging.raiseExceptions
    yield
    for logger, handlers, level, propagate in saved:
        logger.handlers, logger.propagate = handlers, propagate
        logger.setLevel(level)
    logging.raiseExceptions = raise_exceptions


@pytest.mark.usefixtures("own_loggers")
def test_stop_logging_writes_what_is_queued(settings: Settings) -> None:
    from localllm.daemon.server import setup_logging, stop_logging

    path = setup_logging(settings)
    try:
        for i in range(200):
            logging.getLogger("localllm.test").info("queued %d", i)
    finally:
        stop_logging()
    assert sum("queued " in line for line in path.read_text().splitlines()) == 200


def test_every_answer_has_one_access_line_once_it_is_over(tmp_path: Path, tiny_gguf: Path) -> None:
    from test_daemon_support import running_daemon

    with running_daemon(tmp_path / "home") as daemon:
        daemon.create("tiny:log", tiny_gguf)
        with daemon.http() as http:
            body = {"model": "tiny:log", "prompt": "a", "raw": True, "options": {"num_predict": 2}}
            with http.stream("POST", "/api/generate", json=body) as streamed:
                assert streamed.status_code == 200
                assert [line for line in streamed.iter_lines() if line]
            assert http.get("/no/such/route", params={"q": 'a"b'}).status_code == 404
            assert http.get("/health").status_code == 200
    lines = daemon.log().splitlines()  # stopped: everything queued is on disk
    for request in (
        '"POST /api/generate HTTP/1.1" 200',
        '"GET /no/such/route?q=a%22b HTTP/1.1" 404',  # as uvicorn writes it
        '"GET /health HTTP/1.1" 200',
    ):
        found = [line for line in lines if request in line]
        assert len(found) == 1, (request, found)
        assert " INFO uvicorn.access: 127.0.0.1:" in found[0]
