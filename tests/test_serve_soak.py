"""The soak test's short version (benchmarks/serve_soak.py): half a minute of mixed load --
single sentences, lists, bad requests, clients that leave -- with a lane killed every few
seconds: no good request lost or wrong, every bad one refused, the queue empty at the end, the
lanes restarted, and the server serving after."""
import os
import sys

import pytest

pytest.importorskip("uvicorn", reason="the server needs the serve extra")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))
import serve_soak  # noqa: E402


def test_mixed_load_with_lanes_killed_loses_no_request():
    report = serve_soak.soak(30, clients=6, kill_every=(4.0, 7.0), lines=100)
    counts = report["counts"]
    assert report["failures"] == [], report
    assert counts.get("single ok", 0) > 20 and counts.get("several ok", 0) > 5, counts
    assert counts.get("bad refused", 0) > 0 and counts.get("gone", 0) > 0, counts
    assert counts.get("lanes killed", 0) >= 2 and report["lane_restarts"] >= 1, report
    assert report["queue_at_end"] == 0 and report["serves_after"], report
    assert report["dropped_as_clients_left"] > 0, report
