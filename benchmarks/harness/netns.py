"""Network namespaces joined to this host by veth pairs, for cutting a process's link without a TCP
reset (`ip link set ... down`: packets are dropped, nothing answers). Root only; everything is
created by `Host`/`Link` and removed by `remove()`, and traffic stays on the pairs' private /30s.
"""

from __future__ import annotations

import os
import shutil
import subprocess


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (ip netns add, veth pairs)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is missing"
    probe = f"outpost-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False)
    return None


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class Link:
    """A veth pair: `host_addr` on this side, `ns_addr` inside the namespace (a /30 of 10.x)."""

    def __init__(self, ns: str, name: str, subnet: str) -> None:
        base = subnet.rsplit(".", 1)[0]
        last = int(subnet.rsplit(".", 1)[1])
        self.host_dev, self.ns_dev = name, f"{name}n"
        self.host_addr, self.ns_addr = f"{base}.{last + 1}", f"{base}.{last + 2}"
        ip("link", "add", self.host_dev, "type", "veth", "peer", "name", self.ns_dev)
        ip("link", "set", self.ns_dev, "netns", ns)
        ip("addr", "add", f"{self.host_addr}/30", "dev", self.host_dev)
        ip("link", "set", self.host_dev, "up")
        ip("-n", ns, "addr", "add", f"{self.ns_addr}/30", "dev", self.ns_dev)
        ip("-n", ns, "link", "set", self.ns_dev, "up")

    def down(self) -> None:
        ip("link", "set", self.host_dev, "down")

    def up(self) -> None:
        ip("link", "set", self.host_dev, "up")


class Host:
    """One namespace (a "host") with its loopback up; `links` are its veth pairs to this host."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.links: list[Link] = []
        ip("netns", "add", name)
        ip("-n", name, "link", "set", "lo", "up")

    def link(self, dev: str, subnet: str) -> Link:
        made = Link(self.name, dev, subnet)
        self.links.append(made)
        return made

    def argv(self, cmd: list[str]) -> list[str]:
        """`cmd` run inside the namespace (`ip netns exec` execs it: the same pid)."""
        return ["ip", "netns", "exec", self.name, *cmd]

    def remove(self) -> None:
        for link in self.links:  # deleting one end deletes the pair
            subprocess.run(["ip", "link", "del", link.host_dev], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
