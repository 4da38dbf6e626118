"""mxdist.planning.hosts: the hosts file and -H list; every bad word rejected with file:line and the line."""
from __future__ import annotations

from pathlib import Path

import pytest

from mxdist.elastic.rules import parse_discovery
from mxdist.planning.hosts import Host, HostsError, check_env_name, parse_host_entry, parse_host_list, parse_hosts_file

ROOT = Path(__file__).resolve().parents[2]


def test_hosts_file_forms_comments_and_blank_lines():
    text = ("# cluster\n\nnode1\nnode2 port=2222   # sshd port\nalice@node3 slots=4\n  [::1]:port=22 slots=2\n"
            "node5 slots=3\nnode6:slots=2:port=2200 addr=10.1.0.6\n")
    hosts = parse_hosts_file(text, "hosts")
    assert [(h.name, h.port, h.user, h.slots, h.address) for h in hosts] == [
        ("node1", None, None, 1, "node1"), ("node2", 2222, None, 1, "node2"), ("node3", None, "alice", 4, "node3"),
        ("[::1]", 22, None, 2, "::1"), ("node5", None, None, 3, "node5"), ("node6", 2200, None, 2, "10.1.0.6")]
    assert [h.label for h in hosts] == ["node1", "node2:port=2222", "alice@node3", "[::1]:port=22", "node5",
                                        "node6:port=2200"]
    assert hosts[1].origin == "hosts:4"
    # a label is a host entry again
    assert [parse_host_entry(h.label).port for h in hosts] == [h.port for h in hosts]


def test_hosts_example_parses():
    hosts = parse_hosts_file((ROOT / "hosts.example").read_text(), "hosts.example")
    assert len(hosts) >= 3 and any(h.port for h in hosts) and any(h.user for h in hosts)
    assert any(h.slots > 1 for h in hosts)


@pytest.mark.parametrize("line, why", [
    ("node1 slots=x", "slots 'x' in 'node1 slots=x' must be a whole number >= 1"),
    ("node1 slots=0", "slots '0'"),
    ("node1 cpus=2", "unknown field"),
    ("node1 slot=2", "did you mean slots=?"),
    ("node1 node2", "unknown field"),
    ("node1:0", "port '0'"),
    ("node1:4", "in a hosts file HOST:N is the SSH port"),
    ("node1:port=0", "outside 1..65535"),
    ("node1 port=70000", "outside 1..65535"),
    ("node1 port=ssh", "not a number"),
    ("node1:ssh", "neither a slot count nor a field"),
    ("node1:slots=2 slots=3", "slots given twice in 'node1:slots=2 slots=3' (slots=2 and slots=3)"),
    ("node1:2222 port=23", "port given twice in 'node1:2222 port=23' (:2222 and port=23)"),
    ("node1 port=22 port=23", "port given twice"),
    ("fe80::1", "an IPv6 address goes in brackets: [fe80::1]:2"),
    ("node1 addr=$(id)", "not a valid host name"),
    ("node1 addr=", "addr= needs an address"),
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
    assert len(parse_hosts_file("node1\nnode1 port=2222\nbob@node1\n", "f")) == 3


def test_empty_file_is_an_error():
    with pytest.raises(HostsError, match="no hosts"):
        parse_hosts_file("# nothing\n\n", "empty")


def test_inline_list():
    hosts = parse_host_list("a,b:port=2222,user@c")
    assert [h.label for h in hosts] == ["a", "b:port=2222", "user@c"]
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


def test_host_colon_n_is_slots_inline_and_in_a_discovery_script():
    """horovodrun's ``-H h1:2,h2:4`` and Horovod's discovery script: HOST:N is N slots."""
    inline = parse_host_list("h1:2,alice@h2:4,[::1]:3,h4")
    found = parse_discovery("h1:2\nalice@h2:4\n[::1]:3\nh4\n", "find.sh")
    for hosts in (inline, found):
        assert [(h.label, h.slots, h.port) for h in hosts] == [("h1", 2, None), ("alice@h2", 4, None),
                                                               ("[::1]", 3, None), ("h4", 1, None)]
    assert [(h.port, h.slots) for h in parse_host_list("h1:port=2222,h2:2:port=2200,h3 slots=2 port=22")] == [
        (2222, 1), (2200, 2), (22, 2)]


def test_mxnet_hosts_file_ip_port_lines_are_ssh_ports():
    """MXNet's launch.py (the dmlc tracker) reads ``ip:port`` lines: in a hosts file HOST:N is
    the SSH port, one slot per line."""
    hosts = parse_hosts_file("10.0.0.1:22\n10.0.0.2:22\n10.0.0.3:2222\n[fe80::1]:22\n", "hosts")
    assert [(h.address, h.port, h.slots) for h in hosts] == [
        ("10.0.0.1", 22, 1), ("10.0.0.2", 22, 1), ("10.0.0.3", 2222, 1), ("fe80::1", 22, 1)]
    # the same line inline is refused: it could mean either
    with pytest.raises(HostsError) as info:
        parse_host_list("10.0.0.1:22,10.0.0.2:22")
    assert str(info.value) == (
        "-H item 1: '10.0.0.1:22' could mean 22 slots (horovodrun's -H h1:4) or SSH port 22 (MXNet's ip:port): "
        "write 10.0.0.1:slots=22 for 22 slots, or 10.0.0.1:port=22 for SSH port 22")
    # horovodrun's slots and the explicit fields mean the same in both places
    for hosts in (parse_hosts_file("h1 slots=4\nh2:slots=2:port=2200\n", "hosts"),
                  parse_host_list("h1:4,h2:2:port=2200")):
        assert [(h.name, h.slots, h.port) for h in hosts] == [("h1", 4, None), ("h2", 2, 2200)]


@pytest.mark.parametrize("number", ["1", "4", "23", "1024"])
def test_a_hosts_file_number_that_could_be_slots_or_a_port_is_refused_naming_both(number):
    with pytest.raises(HostsError) as info:
        parse_hosts_file(f"node0\nalice@node1:{number}\n", "hosts")
    assert str(info.value) == (
        f"hosts:2: 'node1:{number}': in a hosts file HOST:N is the SSH port (MXNet's ip:port lines), and {number} "
        f"could be a slot count (horovodrun's -H h1:4) as well: write node1:slots={number} for {number} slots, "
        f"or node1:port={number} for SSH port {number}\n  2 | alice@node1:{number}")


@pytest.mark.parametrize("spec", ["node2:2222", "node2:8022", "alice@node2:2222"])
def test_a_port_written_as_host_colon_port_inline_says_what_to_write(spec):
    with pytest.raises(HostsError) as info:
        parse_host_list(spec)
    port = spec.rsplit(":", 1)[1]
    host = spec.split(":")[0].split("@")[-1]
    assert str(info.value) == (
        f"-H: '{spec.split('@')[-1]}': HOST:N in -H means N slots (as horovodrun -H and the discovery script), and "
        f"{port} is more than 1024; for SSH port {port} write {host}:port={port} (or Port in ~/.ssh/config)")
    # in a hosts file it is MXNet's ip:port
    assert parse_hosts_file(f"{spec} slots=2\n", "hosts")[0].port == int(port)
