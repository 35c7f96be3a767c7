"""Notice sources turn SIGTERM, a notice file or GCE's metadata into one stop event."""

from __future__ import annotations

import http.server
import signal
import threading
import typing

import pytest

from rlax.core.errors import Preempted
from rlax.core.runtime.preemption import FileNotice, GceMetadataNotice, Preemption, SignalNotice


def test_sigterm_sets_the_event_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with Preemption([SignalNotice()], role="trainer") as p:
        assert not p.requested
        signal.raise_signal(signal.SIGTERM)
        assert p.wait(5.0) and p.reason == "SIGTERM"
        signal.raise_signal(signal.SIGINT)  # a second notice keeps the first reason
        assert p.reason == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_notice_file_appearing_is_a_notice(tmp_path):
    path = tmp_path / "preempt"
    with Preemption([FileNotice(path=str(path), poll_s=0.05)], role="worker") as p:
        assert not p.wait(0.2)
        path.write_text("")
        assert p.wait(5.0)
        assert p.reason == f"notice file {path}"


class _Metadata(http.server.BaseHTTPRequestHandler):
    value = b"FALSE"
    headers_seen: typing.ClassVar[list] = []

    def do_GET(self):  # http.server names it
        type(self).headers_seen.append(self.headers.get("Metadata-Flavor"))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(type(self).value)

    def log_message(self, *args):
        pass


def test_gce_metadata_probe_fires_on_true_only():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/computeMetadata/v1/instance/preempted"
    try:
        with Preemption([GceMetadataNotice(url=url, poll_s=0.05)], role="trainer") as p:
            assert not p.wait(0.3)  # FALSE, polled several times
            _Metadata.value = b"TRUE"
            assert p.wait(5.0)
            assert p.reason == f"GCE metadata {url} = TRUE"
        assert set(_Metadata.headers_seen) == {"Google"}
    finally:
        server.shutdown()


def test_an_unreachable_metadata_server_is_not_a_notice():
    probe = GceMetadataNotice(url="http://127.0.0.1:9/preempted", poll_s=0.05, timeout_s=0.2)
    with Preemption([probe], role="worker") as p:
        assert not p.wait(0.4)


def test_no_source_is_polled_unless_configured():
    p = Preemption(role="trainer")
    assert [type(s) for s in p.sources] == [SignalNotice]


def test_stop_now_calls_the_hook_then_raises_preempted():
    calls = []

    class Hook:
        def rlax_on_preemption(self, **kwargs):
            calls.append(kwargs)

    p = Preemption([], role="param_server", hook=Hook())
    p.notify("notice file /x")
    with pytest.raises(Preempted, match=r"param_server stopped at a safe point \(notice file /x\)"):
        p.stop_now()
    assert calls == [{"role": "param_server", "reason": "notice file /x"}]


def test_the_supervisors_finish_signal_stops_quietly_with_status_0(capfd, monkeypatch):
    """At the end of a run the supervisor sends FINISH_SIGNAL: a safe-point stop, not a preemption."""
    from rlax.core import cli
    from rlax.core.errors import RunFinished
    from rlax.core.runtime.preemption import FINISH_SIGNAL

    with Preemption([], role="worker") as stop:
        signal.raise_signal(FINISH_SIGNAL)
        assert stop.wait(5) and stop.finished and stop.reason == "the run finished"
        with pytest.raises(RunFinished):
            stop.stop_now()
    assert "preemption" not in capfd.readouterr().err
    assert signal.getsignal(FINISH_SIGNAL) is signal.SIG_DFL  # restored on close

    def finished(args, bindings):
        raise RunFinished("worker: the run finished")

    monkeypatch.setattr(cli, "_parser", lambda: _FakeParser(finished))
    assert cli.main(["run"]) == 0  # not 75: nothing to restart
    assert capfd.readouterr().err == ""


class _FakeParser:
    def __init__(self, handler):
        self.handler = handler

    def parse_args(self, argv):
        import argparse

        return argparse.Namespace(command="run", handler=self.handler)

    def print_usage(self, file):
        pass
