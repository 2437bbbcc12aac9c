"""Smaller edge findings: a 500 leaves the keep-alive connection usable; Idempotency-Key is UTF-8 counted in
characters; a too-long tag says characters; bidirectional controls and invisible characters are refused in names,
tags and device names (one name could display as another). Real Postgres; a real uvicorn for the connection.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import uvicorn

from api.app import create_app
from core.settings import Settings

SPEC = {"name": "s", "model": "debug", "gpu_counts": [1], "precisions": ["bf16"], "steps": 4, "warmup_steps": 1}
IMPORT = {
    "name": "imp",
    "model": "debug",
    "cluster": "local-cpu",
    "seq_len": 256,
    "points": [{"num_devices": 1, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 1000.0}],
}
RLO, ZWSP = "\u202e", "\u200b"


@contextmanager
def serving_with_a_failing_route(settings: Settings) -> Iterator[int]:
    app = create_app(settings)

    def fails() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/fails", fails)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def test_after_a_500_the_same_keep_alive_connection_answers(test_settings) -> None:
    with serving_with_a_failing_route(test_settings) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        local_ends = []  # (address, port) of our end of the socket each answer came on
        for path, status in (("/fails", 500), ("/healthz", 200), ("/fails", 500), ("/healthz", 200)):
            conn.request("GET", path)
            assert conn.sock is not None
            local_ends.append(conn.sock.getsockname())
            r = conn.getresponse()
            body = r.read()
            assert r.status == status, (path, body)
            assert not r.will_close, (path, r.getheader("connection"))
            if status == 500:
                assert r.getheader("content-type") == "application/problem+json"
                assert json.loads(body)["detail"] == "internal error: RuntimeError"
        # http.client reconnects silently after a closed connection: a new socket would have a new local port
        assert len(set(local_ends)) == 1, local_ends
        conn.close()


def test_idempotency_key_is_utf8_counted_in_characters(client) -> None:
    key = "ключ-" + "é" * 195  # 200 characters, 395 bytes
    headers = {"Idempotency-Key": key.encode()}  # UTF-8 bytes on the wire
    first = client.post("/experiments", json=SPEC, headers=headers)
    assert first.status_code == 201, first.text
    again = client.post("/experiments", json=SPEC, headers=headers)
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    too_long = client.post("/experiments", json=SPEC, headers={"Idempotency-Key": (key + "é").encode()})
    assert too_long.status_code == 422
    [err] = too_long.json()["errors"]
    assert err["field"] == "header.Idempotency-Key" and "at most 200 characters (201 were sent)" in err["message"]


def test_an_idempotency_key_that_is_not_utf8_is_a_422(test_settings, api_token) -> None:
    with serving_with_a_failing_route(test_settings) as port:  # raw bytes on the wire: a real server
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.putrequest("POST", "/experiments")
        for name, value in (
            ("Authorization", f"Bearer {api_token}".encode()),
            ("Content-Type", b"application/json"),
            ("Content-Length", str(len(json.dumps(SPEC))).encode()),
            ("Idempotency-Key", "été".encode("latin-1")),
        ):
            conn.putheader(name, value)
        conn.endheaders(json.dumps(SPEC).encode())
        r = conn.getresponse()
        body = json.loads(r.read())
        conn.close()
    assert r.status == 422 and "not valid UTF-8" in body["errors"][0]["message"], body


@pytest.mark.parametrize("path, body", [("/experiments", SPEC), ("/experiments/import", IMPORT)])
def test_a_too_long_tag_says_characters(client, path, body) -> None:
    r = client.post(path, json=body | {"tags": ["x" * 65]})
    assert r.status_code == 422
    [err] = r.json()["errors"]
    assert err["field"] == "tags[0]" and err["message"] == "String should have at most 64 characters"


@pytest.mark.parametrize("hidden", [RLO, "\u2066", "\u200f", ZWSP, "\ufeff"])
def test_names_tags_and_device_names_refuse_bidi_controls_and_invisible_characters(client, hidden) -> None:
    looks_like = f"exp-fp8{hidden}61fb"
    cases = [
        ("/experiments", SPEC | {"name": looks_like}, "name"),
        ("/experiments", SPEC | {"tags": [looks_like]}, "tags[0]"),
        ("/experiments/import", IMPORT | {"name": looks_like}, "name"),
        (
            "/experiments/import",
            IMPORT | {"cluster": "elsewhere", "vendor": "nvidia", "device_name": f"NVIDIA H100{hidden}"},
            "device_name",
        ),
        ("/suites", {"name": looks_like, "spec": SPEC}, "name"),
    ]
    for path, body, field in cases:
        r = client.post(path, json=body)
        assert r.status_code == 422, (path, field, r.text)
        errors = {e["field"]: e["message"] for e in r.json()["errors"]}
        assert field in errors and f"U+{ord(hidden):04X}" in errors[field], (path, errors)
    assert client.get("/experiments").json()["items"] == []


def test_joiners_that_scripts_and_emoji_need_are_kept(client) -> None:
    r = client.post("/experiments", json=SPEC | {"name": "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 👩\u200d🔬"})
    assert r.status_code == 201, r.text
