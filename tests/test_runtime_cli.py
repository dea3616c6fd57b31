"""``p2p sub`` / ``p2p pub`` / ``p2p status`` as outside scripts call them (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
from _cli import P2P
from _cli import make_fleet as _fleet

from p2p.cli import main


def test_sub_pub_and_status_over_mdns(tmp_path: Path) -> None:
    ids = _fleet(tmp_path, ["a", "b", "c"])
    service = ["--service-type", f"_t{uuid.uuid4().hex[:10]}._tcp.local."]
    sub = subprocess.Popen(
        [*P2P, "sub", "--identity", str(tmp_path / "a"), "room", "--count", "3", "--json",
         "--duration", "60", "--settle", "0", *service],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        status = subprocess.run(
            [*P2P, "status", "--identity", str(tmp_path / "c"), "--wait", "3", "--json", *service],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        report = json.loads(status.stdout)
        assert report["node"]["id"] == ids["c"]
        assert ids["a"] in [m["id"] for m in report["members"]]
        assert ids["c"] not in [m["id"] for m in report["members"]]  # status never announces
        pub = subprocess.run(
            [*P2P, "pub", "--identity", str(tmp_path / "b"), "room", "--settle", "2", *service,
             "--min-subscribers", "1"],
            input="one\ntwo\nthree\n", capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert pub.returncode == 0, pub.stderr
        # a confirmed each message; the publisher b is not counted, c never subscribed
        assert "published 3 on 'room': each confirmed by 1 other subscriber\n" in pub.stderr
        out, err = sub.communicate(timeout=30)
    finally:
        sub.kill()
        sub.wait()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(d["source"], d["seq"], d["payload"]) for d in lines] == [
        (ids["b"], 1, "one"),
        (ids["b"], 2, "two"),
        (ids["b"], 3, "three"),
    ], err
    assert sub.returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pub", "--identity", "x", "t", "m", "--no-mdns"], "--no-mdns needs"),
        (["pub", "--identity", "x", "t", "m", "--seed", "nohost"], "HOST:PORT"),
        (["sub", "--identity", "x", "t", "--count", "0"], "--count"),
        (["status", "--identity", "x", "--wait", "0"], "--wait"),
        (["sub", "--identity", "missing-dir", "t", "--settle", "0"], "no such node directory"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_pub_says_when_nobody_confirmed(tmp_path: Path) -> None:
    _fleet(tmp_path, ["a"])
    pub = [*P2P, "pub", "--identity", str(tmp_path / "a"), "room", "hello", "--settle", "0",
           "--no-mdns", "--seed", "127.0.0.1:9"]  # fmt: skip
    alone = subprocess.run(pub, capture_output=True, text=True, timeout=60, check=False)
    assert alone.returncode == 0, alone.stderr
    assert "each confirmed by 0 other subscribers" in alone.stderr
    assert "warning: no other subscriber of 'room'" in alone.stderr
    strict = subprocess.run(
        [*pub, "--min-subscribers", "1", "--quiet"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert strict.returncode == 1
    assert "Traceback" not in strict.stderr
    assert strict.stderr.splitlines()[-1] == (
        "p2p: error: message 1 was confirmed by 0 other subscribers, fewer than --min-subscribers 1"
    )


def test_pub_of_more_lines_than_a_subscription_holds_drops_nothing(tmp_path: Path) -> None:
    """``p2p pub`` never read its own subscription, so past ``delivery_buffer``
    (10,000) lines of stdin its own copies were dropped with an error line."""
    _fleet(tmp_path, ["a"])
    pub = [*P2P, "pub", "--identity", str(tmp_path / "a"), "room", "--settle", "0",
           "--no-mdns", "--seed", "127.0.0.1:9"]  # fmt: skip
    lines = "".join(f"{i}\n" for i in range(12_000))
    done = subprocess.run(
        pub, input=lines, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "published 12000 on 'room'" in done.stderr
    assert "not being read" not in done.stderr


def test_pub_takes_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    """Undecodable stdin (or argv) raised a UnicodeEncodeError traceback; a
    payload is bytes, published as given."""
    _fleet(tmp_path, ["a"])
    pub = [*P2P, "pub", "--identity", str(tmp_path / "a"), "room", "--settle", "0",
           "--no-mdns", "--seed", "127.0.0.1:9"]  # fmt: skip
    done = subprocess.run(pub, input=b"caf\xc3\xa9\n\xff\xfe\n", capture_output=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert b"published 2 on 'room'" in done.stderr
    at = pub.index("room") + 1  # MESSAGE right after TOPIC
    with_arg = [*pub[:at], os.fsdecode(b"arg\xff"), *pub[at:]]
    arg = subprocess.run(with_arg, capture_output=True, timeout=60, check=False)
    assert arg.returncode == 0, arg.stderr
    assert b"Traceback" not in arg.stderr
    assert b"published 1 on 'room'" in arg.stderr


def test_sub_into_a_pipe_that_closes_ends_quietly(tmp_path: Path) -> None:
    """``p2p sub ... | head -1`` ended with "p2p: error: Broken pipe" (exit 1):
    a reader that leaves is a normal end, as --count is."""
    _fleet(tmp_path, ["a", "b"])
    service = ["--service-type", f"_t{uuid.uuid4().hex[:10]}._tcp.local."]
    sub = subprocess.Popen(
        [*P2P, "sub", "--identity", str(tmp_path / "a"), "room", "--duration", "60",
         "--settle", "0", *service],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip

    def publish(text: str) -> None:
        pub = subprocess.run(
            [*P2P, "pub", "--identity", str(tmp_path / "b"), "room", text, "--settle", "2",
             *service, "--min-subscribers", "1"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert pub.returncode == 0, pub.stderr

    try:
        assert sub.stdout is not None
        publish("one")
        assert sub.stdout.readline().endswith(b" 1 one\n")
        sub.stdout.close()  # the reader leaves
        publish("two")  # the next print meets the closed pipe
        _, err = sub.communicate(timeout=30)
    finally:
        sub.kill()
        sub.wait()
    assert sub.returncode == 0, err
    assert b"error" not in err
