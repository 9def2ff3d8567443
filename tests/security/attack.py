"""What the security tests share: the attacker's build script and the bwrap skip mark
(no import of the sandbox code, so the end-to-end tests also run against a server
without it and show what leaked)."""

from __future__ import annotations

import shutil

import pytest

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None,
    reason="needs bubblewrap on PATH (apt-get install bubblewrap; .ci/run installs it)")

# The attacker's build: tries everything it is told to in targets.json and prints
# whatever it manages to read (so a leak lands in the log), then a REPORT line.
ATTACK = """\
import json, os, socket, subprocess, sys
t = json.load(open("targets.json"))
report = {}
def read(name, path):
    try:
        with open(path, "rb") as fh:
            data = fh.read()
        report[name] = "read"
        print(f"READ {name}: {data[:20000]!r}", flush=True)
    except OSError as exc:
        report[name] = type(exc).__name__
for pid in ["1", str(t.get("server_pid", 1)), "self"]:
    read(f"environ:{pid}", f"/proc/{pid}/environ")
report["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
for name, path in t.get("read", {}).items():
    read(name, path)
for name, path in t.get("list", {}).items():
    try:
        report[name] = sorted(os.listdir(path))
    except OSError as exc:
        report[name] = type(exc).__name__
for name, path in t.get("write", {}).items():
    try:
        with open(path, "w") as fh:
            fh.write("pwned")
        report[name] = "written"
    except OSError as exc:
        report[name] = type(exc).__name__
if "port" in t:
    try:
        socket.create_connection(("127.0.0.1", t["port"]), timeout=5).close()
        report["connect"] = "ok"
    except OSError as exc:
        report["connect"] = type(exc).__name__
report["env"] = dict(os.environ)
report["uid"] = os.getuid()
report["fds"] = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))  # + listdir's own
print("REPORT " + json.dumps(report), flush=True)
if t.get("spawn"):
    # a child in the command's process group, and a grandchild that leaves it (setsid)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    if os.fork() == 0:
        os.setsid()
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)"])
    print("SPAWNED", flush=True)
if t.get("sleep"):
    import time
    time.sleep(t["sleep"])
"""
