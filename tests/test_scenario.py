"""The scenario format of ``p2p sim`` (a contract with outside scripts)."""

from __future__ import annotations

import pytest

from p2p import ScenarioError
from p2p.sim import Action, parse_scenario


def test_parses_lines_comments_and_star() -> None:
    text = """
    # a comment line
    10;SUB;*;news        # every node
    5;PUB;1;news;hello world
    7.5;uns;0;news
    """
    actions = parse_scenario(text.splitlines(), nodes=3)
    assert actions[0] == Action(5.0, "PUB", 1, "news", b"hello world", 4)
    assert actions[1].action == "UNS"
    assert actions[1].time == 7.5
    assert [a.node for a in actions[2:]] == [0, 1, 2]
    assert all(a.action == "SUB" and a.line == 3 for a in actions[2:])


def test_hint_lines_name_the_node_hinted_about() -> None:
    actions = parse_scenario(["3;HINT;*;2"], nodes=3)
    assert [(a.action, a.node, a.topic) for a in actions] == [("HINT", n, "2") for n in range(3)]


def test_sorted_by_time_stably() -> None:
    actions = parse_scenario(["5;PUB;0;t;a", "1;SUB;0;t", "5;PUB;0;t;b"], nodes=1)
    assert [a.payload for a in actions] == [b"", b"a", b"b"]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("1;SUB;0", "expected time;ACTION;node;topic"),
        ("x;SUB;0;t", "time 'x' is not a number"),
        ("-1;SUB;0;t", "finite and >= 0"),
        ("inf;SUB;0;t", "finite and >= 0"),
        ("1;JOIN;0;t", "unknown action"),
        ("1;SUB;9;t", "out of range 0..3"),
        ("1;SUB;a;t", "not an index or *"),
        ("1;SUB;0;", "SUB needs a topic"),
        ("1;HINT;0;", "HINT needs the node it hints about"),
        ("1;HINT;0;7", "node 7 out of range 0..3"),
        ("1;HINT;0;t", "node 't' is not an index"),
        ("1;SUB;0;t;payload", "only PUB takes a payload"),
        ("1;PUB;0;t;a;b", "got 6 fields"),
    ],
)
def test_malformed_lines_name_line_and_reason(line: str, reason: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(["# header", "0;SUB;0;t", line], nodes=4)
    assert "line 3" in str(info.value)
    assert reason in str(info.value)


def test_reset_lines_name_the_other_end_and_skip_the_node_itself() -> None:
    actions = parse_scenario(["3;RESET;*;2", "4;reset;0;1"], nodes=3)
    assert [(a.action, a.node, a.topic) for a in actions] == [
        ("RESET", 0, "2"),
        ("RESET", 1, "2"),
        ("RESET", 0, "1"),
    ]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("1;RESET;0;", "RESET needs the other end"),
        ("1;RESET;0;9", "node 9 out of range 0..3"),
        ("1;RESET;2;2", "RESET of node 2's connection to itself"),
        ("1;RESET;0;1;x", "only PUB takes a payload"),
    ],
)
def test_malformed_reset_lines_name_line_and_reason(line: str, reason: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(["# header", "0;SUB;0;t", line], nodes=4)
    assert "line 3" in str(info.value)
    assert reason in str(info.value)


def test_twin_lines_take_a_node_and_no_topic() -> None:
    actions = parse_scenario(["3;TWIN;1", "4;twin;*"], nodes=2)
    assert [(a.action, a.node, a.topic) for a in actions] == [
        ("TWIN", 1, ""),
        ("TWIN", 0, ""),
        ("TWIN", 1, ""),
    ]
    with pytest.raises(ScenarioError, match="line 1: TWIN takes no topic"):
        parse_scenario(["3;TWIN;1;t"], nodes=2)
