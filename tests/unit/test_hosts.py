"""mxdist.hosts: the hosts file and -H list; every bad word rejected with file:line and the line."""
from __future__ import annotations

from pathlib import Path

import pytest

from mxdist.hosts import Host, HostsError, check_env_name, parse_host_list, parse_hosts_file

ROOT = Path(__file__).resolve().parents[2]


def test_hosts_file_forms_comments_and_blank_lines():
    text = "# cluster\n\nnode1\nnode2:2222   # sshd port\nalice@node3 slots=4\n  [::1]:22 slots=2\n"
    hosts = parse_hosts_file(text, "hosts")
    assert [(h.name, h.port, h.user, h.slots) for h in hosts] == [
        ("node1", None, None, 1), ("node2", 2222, None, 1), ("node3", None, "alice", 4), ("[::1]", 22, None, 2)]
    assert [h.label for h in hosts] == ["node1", "node2:2222", "alice@node3", "[::1]:22"]
    assert hosts[3].address == "::1"
    assert hosts[1].origin == "hosts:4"


def test_hosts_example_parses():
    hosts = parse_hosts_file((ROOT / "hosts.example").read_text(), "hosts.example")
    assert len(hosts) >= 3 and any(h.port for h in hosts) and any(h.user for h in hosts)
    assert any(h.slots > 1 for h in hosts)


@pytest.mark.parametrize("line, why", [
    ("node1 slots=x", "slots='x'"),
    ("node1 slots=0", "slots='0'"),
    ("node1 cpus=2", "unknown field"),
    ("node1 node2", "unknown field"),
    ("node1:0", "outside 1..65535"),
    ("node1:70000", "outside 1..65535"),
    ("node1:ssh", "not a number"),
    ("h;touch /tmp/x", "not a valid host name"),
    ("$(id)", "not a valid host name"),
    ("`id`", "not a valid host name"),
    ("-oProxyCommand=touch_x", "starts with '-'"),
    ("a|b", "not a valid host name"),
    ("$(id)@node1", "not a valid user name"),
    ("-l@node1", "not a valid user name"),
    ("[::1", "unclosed"),
])
def test_bad_lines_name_file_line_and_quote_the_line(line, why):
    text = f"# header\nnode0\n{line}\n"
    with pytest.raises(HostsError) as info:
        parse_hosts_file(text, "my.hosts")
    message = str(info.value)
    assert "my.hosts:3" in message and why in message
    assert f"3 | {line}" in message


def test_duplicates_are_rejected_with_both_places():
    with pytest.raises(HostsError, match=r"f:3: duplicate host 'node1' \(first at f:1\)"):
        parse_hosts_file("node1\nnode2\nnode1 slots=2\n", "f")
    # same name on another port or user is another host
    assert len(parse_hosts_file("node1\nnode1:2222\nbob@node1\n", "f")) == 3


def test_empty_file_is_an_error():
    with pytest.raises(HostsError, match="no hosts"):
        parse_hosts_file("# nothing\n\n", "empty")


def test_inline_list():
    hosts = parse_host_list("a,b:2222,user@c")
    assert [h.label for h in hosts] == ["a", "b:2222", "user@c"]
    assert all(h.slots == 1 for h in hosts)
    with pytest.raises(HostsError, match="-H item 2"):
        parse_host_list("a,h;id")
    with pytest.raises(HostsError, match="duplicate"):
        parse_host_list("a,a")
    with pytest.raises(HostsError, match="empty host"):
        parse_host_list("a,,b")


def test_env_names():
    assert check_env_name("OMP_NUM_THREADS") == "OMP_NUM_THREADS"
    for bad in ("1X", "A-B", "A B", "$(id)", "", "A;B"):
        with pytest.raises(HostsError):
            check_env_name(bad)


def test_host_defaults():
    host = Host("node1")
    assert host.address == "node1" and host.slots == 1 and host.label == "node1"
