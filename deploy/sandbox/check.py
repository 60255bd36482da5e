#!/usr/bin/env python3
"""The release binaries under a sandbox runtime: gVisor's runsc (what CI runs), or runc for
comparison. Called by deploy/check.sh; needs no Docker engine.

usage: deploy/sandbox/check.py [--dist DIR] [--runtime runsc|runc]...
       (default: --dist target/dist/<host arch>, --runtime runsc; RUNR_SANDBOX_RUNTIMES="runsc
       runc" runs every check under both and prints their times side by side)

Every binary runs as PID 1 of an OCI bundle (`runsc spec`'s config without its network
namespace, so `--network=host` reaches the registry and Redis on the host), as user 65532 with
no capabilities, no new privileges and a read-only root, with the environment of its container
in deploy/k8s (only host-specific values replaced: free ports instead of 8080, 127.0.0.1 instead
of cluster names, secrets filled in; each replacement is printed):

  install      the function pods' init container: `runr-wrapper install /runr/runr-wrapper`
               into an emptyDir; every function below runs that installed copy
  exec         busybox and a static handler (wrapper/tests/fixtures/stress_handler.c):
               answers of 0 B to 1 MiB byte for byte at concurrency 16, a timeout that kills the
               handler's whole process group, orphans reparented to the wrapper and reaped
               (`runsc exec ... ps`), the per-invocation peak RSS, SIGTERM drain and exit 0
  exec-bash    function-exec.yaml as it is (bash from the host's /usr, read-only), and runr-tick
               in its own FROM scratch root sending that function a schedule tick
  persistent   knative-persistent.yaml (two Python workers)
  schedule     schedule-cronjob.yaml as it is (http mode, the invoke sequence, exit 0)
  observed     the same program behind the observed proxy (RUNR_TRACING=1)
  lambda       the AWS tutorial's bash bootstrap (wrapper/tests/fixtures/lambda), two runtimes
  not-pid1     the wrapper as a child of sh: either it becomes a subreaper and reaps orphans,
               or its warning says what the operator loses
  upload       runr-image-upload (image-receiver.yaml): a skopeo docker-archive in 64 KiB chunks
               at concurrency 16, verified and pushed into a docker-registry on the host, pulled
               back by skopeo and compared
  prewarm      runr-prewarm (prewarm-job.yaml) warming that image through a second docker-registry
               configured as a pull-through cache of the first; its blobs must be in the cache
  queue        runr-queue (queue-trigger.yaml) delivering 16 entries from a redis-server on the
               host to the exec-mode function of that manifest, all acknowledged; SIGTERM, exit 0

Output: `[sandbox]` lines; a table of each check's requests and seconds per runtime at the end.
Exit status: 0 every check passed; 1 a check failed (one `[sandbox] FAIL: ...` line each);
3 runsc is missing or cannot start a sandbox here (one `[sandbox] skip: ...` line saying why;
the other runtimes asked for still ran, and passed).
RUNR_SANDBOX_DEBUG=DIR: runsc writes its debug and syscall (--strace) logs into DIR.
"""

import argparse
import hashlib
import http.client
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

try:
    import yaml
except ImportError as e:
    print(f"[sandbox] FAIL: {e.name} is not installed for {sys.executable} "
          "(python3 -m pip install -r tests/requirements.txt; .ci/run does it)")
    sys.exit(1)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
K8S = os.path.join(ROOT, "deploy", "k8s")
FIXTURES = os.path.join(ROOT, "wrapper", "tests", "fixtures")

# Every pod of deploy/k8s runs as this user with no capabilities.
USER = 65532
# The PATH of the bash and python images the manifests name.
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CONCURRENCY = 16
# Hang guards, far above what any of these takes (seconds).
START_GUARD = 60
EXIT_GUARD = 60
# The wrapper's drain limit is 25 s, its workers' grace 5 s: what SIGTERM may take at most.
DRAIN_GUARD = 45
# Exit status when runsc cannot run here.
EXIT_SKIP = 3


def say(msg):
    print(f"[sandbox] {msg}", flush=True)


class Failed(Exception):
    """A check found something wrong; the message says what."""


class Skip(Exception):
    """The sandbox cannot run here at all."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wait_until(what, cond, limit, interval=0.1):
    """Polls cond() until it returns something true, which is returned; Failed at the limit."""
    deadline = time.monotonic() + limit
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {limit}s waiting for {what}")
        time.sleep(interval)


# === manifests ===================================================================================

def manifest(name):
    with open(os.path.join(K8S, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def pod_spec(doc):
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]


def k8s_container(name, container, init=False):
    """The container `container` of the first workload in manifest `name` that has one."""
    for doc in manifest(name):
        if doc["kind"] in ("ConfigMap", "Service") and doc.get("apiVersion") == "v1":
            continue
        pod = pod_spec(doc)
        for c in pod.get("initContainers" if init else "containers", []):
            if c["name"] == container:
                return c
    raise Failed(f"deploy/k8s/{name} has no container {container}")


def config_map(name):
    for doc in manifest(name):
        if doc["kind"] == "ConfigMap":
            return doc["data"]
    raise Failed(f"deploy/k8s/{name} has no ConfigMap")


class Env:
    """A container's environment as its manifest gives it, with the replacements a host needs
    (value None: left out) and additions; describe() says what differs from the manifest."""

    def __init__(self, name, container, changes, why):
        self.source = f"{name} ({container['name']})"
        self.why = why
        env = {}
        from_secret = []
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            else:
                from_secret.append(e["name"])
        self.changed = []
        for k, v in changes.items():
            was = env.get(k, "<secret>" if k in from_secret else None)
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
            now = "unset" if v is None else f"={v!r}"
            self.changed.append(f"{k}{now}" + ("" if was is None else f" (manifest: {was!r})"))
        self.dropped = [k for k in from_secret if k not in changes]
        self.vars = env

    def describe(self):
        parts = ", ".join(self.changed) or "nothing changed"
        if self.dropped:
            parts += "; optional secrets left out: " + ", ".join(self.dropped)
        return f"env of {self.source}: {parts}" + (f" ({self.why})" if self.why else "")

    def list(self):
        return [f"PATH={PATH}"] + [f"{k}={v}" for k, v in self.vars.items()]


# === bundles =====================================================================================

def base_spec():
    """`runsc spec`'s config (runc's where runsc is missing), without the network namespace."""
    with tempfile.TemporaryDirectory() as d:
        tool = "runsc" if shutil.which("runsc") else "runc"
        r = subprocess.run([tool, "spec"], cwd=d, capture_output=True, text=True)
        if r.returncode != 0:
            raise Failed(f"{tool} spec exited {r.returncode}: {r.stderr.strip()[-300:]}")
        with open(os.path.join(d, "config.json")) as f:
            spec = json.load(f)
    spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"] if n["type"] != "network"]
    return spec


def bind(source, dest, ro=True):
    return {"destination": dest, "type": "bind", "source": source,
            "options": ["rbind", "ro" if ro else "rw"]}


def tmpfs(dest, size_mib):
    return {"destination": dest, "type": "tmpfs", "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", f"size={size_mib}m"]}


class Bundle:
    """An OCI bundle: a root of one kind, the pod's restrictions, a process and its mounts.

    root kinds: ("scratch", {path: file}) a FROM scratch image; ("busybox", {}) scratch plus
    Debian's static busybox and its applets in /bin; ("host", {}) the host's /usr and /etc,
    read-only, for interpreters (bash, python3, curl)."""

    def __init__(self, work, name, root, args, env, mounts=(), cwd="/", hostname="runr"):
        self.name = name
        self.dir = os.path.join(work, "bundles", name)
        rootfs = os.path.join(self.dir, "rootfs")
        os.makedirs(rootfs)
        kind, files = root
        mounts = list(mounts)
        for d in ("proc", "dev", "sys"):
            os.makedirs(os.path.join(rootfs, d))
        if kind == "host":
            for top in ("usr", "etc"):
                os.makedirs(os.path.join(rootfs, top))
                mounts.insert(0, bind(f"/{top}", f"/{top}"))
            for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
                host = f"/{top}"
                if os.path.islink(host):
                    os.symlink(os.readlink(host), os.path.join(rootfs, top))
                elif os.path.isdir(host):
                    os.makedirs(os.path.join(rootfs, top))
                    mounts.insert(0, bind(host, host))
            self.busybox = "/usr/bin/busybox" if os.path.exists("/usr/bin/busybox") else "/bin/busybox"
        else:
            # What the kubelet mounts into every container.
            os.makedirs(os.path.join(rootfs, "etc"))
            for f in ("hosts", "resolv.conf"):
                open(os.path.join(rootfs, "etc", f), "w").close()
                mounts.append(bind(f"/etc/{f}", f"/etc/{f}"))
            self.busybox = None
        if kind == "busybox":
            os.makedirs(os.path.join(rootfs, "bin"))
            shutil.copy2(shutil.which("busybox"), os.path.join(rootfs, "bin", "busybox"))
            applets = subprocess.run(["busybox", "--list"], capture_output=True, text=True,
                                     check=True).stdout.split()
            for a in applets:
                if a != "busybox":
                    os.symlink("busybox", os.path.join(rootfs, "bin", a))
            self.busybox = "/bin/busybox"
        for path, src in files.items():
            dest = os.path.join(rootfs, path.lstrip("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(src, dest)
        for m in mounts:
            point = os.path.join(rootfs, m["destination"].lstrip("/"))
            if os.path.exists(point) or os.path.islink(point):
                continue
            if m["type"] == "bind" and os.path.isfile(m["source"]):
                os.makedirs(os.path.dirname(point), exist_ok=True)
                open(point, "w").close()
            else:
                os.makedirs(point)
                if m["type"] == "tmpfs":
                    # runc gives a tmpfs the mode of its mount point, whatever mode= says.
                    os.chmod(point, 0o1777)

        spec = json.loads(json.dumps(BASE_SPEC))
        p = spec["process"]
        p["args"] = args
        p["env"] = env
        p["cwd"] = cwd
        p["user"] = {"uid": USER, "gid": USER}
        p["capabilities"] = {k: [] for k in ("bounding", "effective", "inheritable", "permitted")}
        p["noNewPrivileges"] = True
        p["terminal"] = False
        spec["root"] = {"path": "rootfs", "readonly": True}
        spec["hostname"] = hostname
        spec["mounts"] = spec["mounts"] + mounts
        with open(os.path.join(self.dir, "config.json"), "w") as f:
            json.dump(spec, f, indent=1)


# === runtimes and containers =====================================================================

class Runtime:
    def __init__(self, name, work):
        self.name = name
        self.state = os.path.join(work, f"state-{name}")
        os.makedirs(self.state)
        if name == "runsc":
            self.cli = ["runsc", "--root", self.state, "--platform=ptrace", "--network=host"]
            debug = os.environ.get("RUNR_SANDBOX_DEBUG")
            if debug:
                os.makedirs(debug, exist_ok=True)
                self.cli += ["--debug", "--strace", f"--debug-log={os.path.abspath(debug)}/"]
        else:
            self.cli = ["runc", "--root", self.state]

    def leftovers(self):
        out = subprocess.run(self.cli + ["list", "--quiet"], capture_output=True, text=True)
        return out.stdout.split()

    def delete(self, cid):
        subprocess.run(self.cli + ["kill", cid, "KILL"], capture_output=True, timeout=30)
        subprocess.run(self.cli + ["delete", "--force", cid], capture_output=True, timeout=30)

    def cleanup(self):
        for cid in self.leftovers():
            self.delete(cid)


class Container:
    """`<runtime> run` of a bundle in the foreground (the sandbox's PID 1 is our process; its
    exit status is the runtime's), stdout and stderr read through pipes."""

    seq = 0

    def __init__(self, rt, bundle):
        Container.seq += 1
        self.rt = rt
        self.bundle = bundle
        self.id = f"runr-{bundle.name}-{os.getpid()}-{Container.seq}"
        self.out = bytearray()
        self.err = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(
            rt.cli + ["run", "--bundle", bundle.dir, self.id],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        self.readers = [threading.Thread(target=self._read_out, daemon=True),
                        threading.Thread(target=self._read_err, daemon=True)]
        for t in self.readers:
            t.start()

    def _read_out(self):
        for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):
            with self.cond:
                self.out += chunk

    def _read_err(self):
        for line in self.proc.stderr:
            with self.cond:
                self.err.append(line.decode("utf-8", "replace").rstrip("\n"))
                self.cond.notify_all()

    def log(self):
        with self.cond:
            return list(self.err)

    def tail(self, n=8):
        return " | ".join(self.log()[-n:])

    def running(self):
        return self.proc.poll() is None

    def wait_log(self, pattern, limit=START_GUARD):
        """The first log line matching pattern; Failed when the container exits or time runs out."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + limit
        with self.cond:
            while True:
                for line in self.err:
                    if rx.search(line):
                        return line
                if self.proc.poll() is not None:
                    raise Failed(f"{self.bundle.name} exited {self.proc.returncode} before logging "
                                 f"/{pattern}/: {self.tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Failed(f"{self.bundle.name} did not log /{pattern}/ in {limit}s: {self.tail()}")
                self.cond.wait(min(left, 0.2))

    def wait_http(self, port, path="/", headers=None, want=200, limit=START_GUARD):
        """Waits until GET path on port answers `want`."""
        def up():
            if not self.running():
                raise Failed(f"{self.bundle.name} exited {self.proc.returncode}: {self.tail()}")
            try:
                return request(port, "GET", path, headers=headers or {}, timeout=5).status == want
            except OSError:
                return False
        wait_until(f"{self.bundle.name} to answer GET {path} with {want}", up, limit)

    def exec(self, *args, check=True):
        # As the pod's user, so that a kill from here is allowed as it is to the handler.
        r = subprocess.run(self.rt.cli + ["exec", "--user", f"{USER}:{USER}", self.id, *args],
                           capture_output=True, text=True,
                           timeout=60)
        if check and r.returncode != 0:
            raise Failed(f"{self.rt.name} exec {' '.join(args)} exited {r.returncode}: "
                         f"{(r.stderr or r.stdout).strip()[-300:]}")
        return r.stdout

    def ps(self):
        """Processes inside the sandbox (busybox ps), without the ps itself."""
        out = self.exec(self.bundle.busybox, "ps", "-o", "pid,ppid,pgid,stat,args")
        procs = []
        for line in out.splitlines()[1:]:
            f = line.split(None, 4)
            if len(f) < 4:
                continue
            p = {"pid": int(f[0]), "ppid": int(f[1]), "pgid": int(f[2]), "stat": f[3],
                 "args": f[4] if len(f) > 4 else ""}
            if " ps -o pid,ppid" not in " " + p["args"]:
                procs.append(p)
        return procs

    def signal(self, sig):
        subprocess.run(self.rt.cli + ["kill", self.id, sig], check=True, capture_output=True,
                       timeout=30)

    def wait_exit(self, limit=EXIT_GUARD):
        try:
            code = self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            raise Failed(f"{self.bundle.name} still running {limit}s later: {self.tail()}")
        for t in self.readers:
            t.join(timeout=5)
        return code

    def stop(self, want=0, limit=DRAIN_GUARD):
        """SIGTERM, as the kubelet sends it; the exit status must be `want`."""
        self.signal("TERM")
        code = self.wait_exit(limit)
        if code != want:
            raise Failed(f"{self.bundle.name} exited {code} after SIGTERM (want {want}): {self.tail()}")

    def close(self):
        if self.proc.poll() is None:
            self.rt.delete(self.id)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class Daemon:
    """A server on the host (docker-registry, redis-server), in its own process group."""

    def __init__(self, name, argv, log):
        self.name = name
        self.logfile = log
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def tail(self):
        with open(self.logfile, errors="replace") as f:
            return " | ".join(f.read().splitlines()[-5:])

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# === HTTP ========================================================================================

class Resp:
    def __init__(self, r):
        self.status = r.status
        self.reason = r.reason
        self.headers = [(k.lower(), v) for k, v in r.getheaders()]
        self.body = r.read()

    def header(self, name):
        for k, v in self.headers:
            if k == name:
                return v
        return None


def request(port, method, path, headers=None, body=None, conn=None, timeout=60):
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        return Resp(c.getresponse())
    finally:
        if conn is None:
            c.close()


DATE = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d GMT$")


def mismatch(what, got, status, headers, body):
    """What differs between an answer and the expected one (status, the exact set of headers and
    their values, the body byte for byte); None when nothing does. A header's expected value is
    a string, or a function of the value that says whether it is right (`date`: RFC 7231)."""
    problems = []
    if got.status != status:
        problems.append(f"status {got.status} (want {status})")
    want = dict(headers)
    want.setdefault("date", DATE.match)
    want.setdefault("content-length", str(len(body)))
    names = sorted(k for k, _ in got.headers)
    if names != sorted(want):
        problems.append(f"headers {names} (want {sorted(want)})")
    for k, v in want.items():
        value = got.header(k)
        ok = value is not None and (v(value) if callable(v) else value == v)
        if not ok:
            problems.append(f"{k}: {value!r}" + ("" if callable(v) else f" (want {v!r})"))
    if got.body != body:
        at = next((i for i, (a, b) in enumerate(zip(got.body, body)) if a != b), min(len(got.body), len(body)))
        problems.append(f"body of {len(got.body)} bytes (want {len(body)}), first difference at {at}: "
                        f"{got.body[:80]!r}")
    return f"{what}: " + "; ".join(problems) if problems else None


def drive(port, items, one, clients=CONCURRENCY):
    """Sends every item from `clients` threads, each over its own keep-alive connection;
    one(conn, item) returns a problem or None. Raises Failed listing the first problems."""
    problems = []
    lock = threading.Lock()
    queue = list(items)

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while True:
            with lock:
                if not queue:
                    break
                item = queue.pop()
            try:
                p = one(conn, item)
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                p = f"{item}: {type(e).__name__}: {e}"
            if p:
                with lock:
                    problems.append(p)
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if problems:
        raise Failed(f"{len(problems)} of {len(items)} answers wrong: " + " || ".join(problems[:3]))
    return len(items)


CORS = ("access-control-allow-origin", "*")
TEXT = ("content-type", "text/plain; charset=utf-8")
JSON = ("content-type", "application/json")


# === the checks ==================================================================================

MAX_SEED = 1 << 20
MAX_SIZE = 1 << 20
PATTERN = b""


def pattern_bytes(seed, size):
    """stress_handler.c's pattern: byte j is (j * 2654435761 mod 2^32) >> 24, from `seed`."""
    global PATTERN
    if not PATTERN:
        PATTERN = bytes(((j * 2654435761) & 0xFFFFFFFF) >> 24 for j in range(MAX_SEED + MAX_SIZE))
    return PATTERN[seed:seed + size]


def raw_content_type(body):
    """What exec mode answers raw output with: JSON when it parses (as serde_json does), text."""
    try:
        text = body.decode("utf-8")
        if text.strip(" \t\r\n"):
            def refuse(c):
                raise ValueError(c)
            json.loads(text, parse_constant=refuse)
            return "application/json"
    except ValueError:
        pass
    return "text/plain; charset=utf-8"


SIZES = [0, 1, 2, 4095, 4096, 4097, 65535, 65536, 65537, 131071, 131072, 131073, MAX_SIZE]

# The exec handler of the busybox bundle: faults in sh, every known answer from the static
# handler (its paths: wrapper/tests/fixtures/stress_handler.c).
HANDLER_SH = """\
case "$RUNR_PATH" in
  /hang) sleep 3601 & sleep 3602 ;;
  /orphan) sleep 3600 </dev/null >/dev/null 2>&1 & printf '%s' "$!" ;;
  *) exec /app/code/stress_handler ;;
esac
"""


class Checks:
    """The checks under one runtime; each returns how many requests it made or raises Failed."""

    def __init__(self, rt, work, dist, shared, first_runtime):
        self.rt = rt
        # The replaced variables are printed once, under the first runtime.
        self.first_runtime = first_runtime
        # What a run found worth printing at its end (peak RSS, the subreaper outcome).
        self.facts = []
        self.work = os.path.join(work, rt.name)
        os.makedirs(self.work)
        self.dist = dist
        self.shared = shared
        self.containers = []
        self.daemons = []
        self.runr = None

    def bundle(self, name, root, args, env, mounts=(), **kw):
        return Bundle(self.work, name, root, args, env.list(), mounts, **kw)

    def start(self, bundle):
        c = Container(self.rt, bundle)
        self.containers.append(c)
        return c

    def daemon(self, name, argv):
        d = Daemon(name, argv, os.path.join(self.work, f"{name}.log"))
        self.daemons.append(d)
        return d

    def close(self):
        """After each check: its containers. The servers on the host stay for the next checks
        (the cache of prewarm proxies the registry the upload pushed to) until close_all."""
        for c in self.containers:
            c.close()
        self.containers = []

    def close_all(self):
        self.close()
        for d in self.daemons:
            d.close()
        self.daemons = []

    def code_dir(self, name, files):
        d = os.path.join(self.work, "code", name)
        os.makedirs(d)
        for f, text in files.items():
            with open(os.path.join(d, f), "w") as out:
                out.write(text)
        return d

    def function_mounts(self, code):
        # function-exec.yaml: the wrapper's emptyDir read-only at /runr, the code at /app/code,
        # an emptyDir at /tmp.
        return [bind(self.runr, "/runr"), bind(code, "/app/code"), tmpfs("/tmp", 64)]

    # --- install -------------------------------------------------------------------------------
    def install(self):
        init = k8s_container("function-exec.yaml", "runr-wrapper", init=True)
        self.runr = os.path.join(self.work, "emptydir-runr")
        os.makedirs(self.runr)
        os.chmod(self.runr, 0o777)  # the kubelet's emptyDir
        src = os.path.join(self.dist, "runr-wrapper")
        b = Bundle(self.work, "install", ("scratch", {"/runr-wrapper": src}),
                   ["/runr-wrapper"] + init["args"], [], [bind(self.runr, "/runr", ro=False)])
        c = self.start(b)
        code = c.wait_exit()
        dest = os.path.join(self.runr, "runr-wrapper")
        if code != 0:
            raise Failed(f"runr-wrapper {' '.join(init['args'])} exited {code}: {c.tail()}")
        if not os.path.exists(dest) or sha256_file(dest) != sha256_file(src):
            raise Failed(f"runr-wrapper install left no identical copy at /runr/runr-wrapper: {c.tail()}")
        if os.stat(dest).st_mode & 0o777 != 0o755:
            raise Failed(f"/runr/runr-wrapper has mode {oct(os.stat(dest).st_mode & 0o777)}, want 0755")
        return 1

    # --- exec: busybox and the static handler --------------------------------------------------
    def exec_env(self, port, timeout):
        return Env("function-exec.yaml", k8s_container("function-exec.yaml", "function"), {
            "PORT": str(port),
            "RUNR_COMMAND": '["/bin/sh", "/app/code/handler.sh"]',
            "RUNR_TIMEOUT": timeout,
            "RUNR_LOG_INVOCATIONS": "1",
        }, "busybox sh and the static stress handler; a short timeout to test it; "
           "one log line per invocation for the peak RSS")

    def exec_code(self, name):
        code = self.code_dir(name, {"handler.sh": HANDLER_SH})
        shutil.copy2(self.shared["stress_handler"], os.path.join(code, "stress_handler"))
        return code

    def exec_static(self):
        port = free_port()
        env = self.exec_env(port, "3")
        self.note(env)
        code = self.exec_code("exec")
        c = self.start(self.bundle("exec", ("busybox", {}), ["/runr/runr-wrapper"], env,
                                   self.function_mounts(code), cwd="/"))
        c.wait_log(r"running as PID 1")
        c.wait_http(port, headers={"K-Kubelet-Probe": "kube-probe/1.31"})
        requests = 0

        # Known answers at concurrency 16, sizes straddling the pipe and buffer sizes; half of
        # them leave a child behind that holds stdout for 2 s (an orphan once the handler exits).
        rng = random.Random(22)
        items = []
        for i in range(8 * CONCURRENCY):
            size = SIZES[i] if i < len(SIZES) else rng.choice([rng.randrange(300 << 10), rng.randrange(64)])
            items.append(("orphan" if i % 2 else "answer", rng.randrange(MAX_SEED), size))

        def one(conn, item):
            kind, seed, size = item
            body = pattern_bytes(seed, size)
            got = request(port, "POST", f"/{kind}/{seed}/{size}", body=b"x" * (size % 977), conn=conn)
            return mismatch(f"/{kind}/{seed}/{size}", got, 200,
                            [("content-type", raw_content_type(body)), CORS], body)
        requests += drive(port, items, one)

        # The per-invocation line carries the handler's peak RSS (wait4's ru_maxrss). It is
        # written once the answer is sent, so it may trail the answer.
        def invocation_lines():
            found = [l for l in c.log() if " invocation " in l and "status=200" in l]
            return found if len(found) >= len(items) else None
        lines = wait_until(f"{len(items)} invocation lines", invocation_lines, 30)
        rss = [int(m.group(1)) for l in lines for m in [re.search(r"peak_rss_kib=(\d+)", l)] if m]
        if len(rss) != len(lines) or min(rss) <= 0:
            raise Failed(f"peak_rss_kib missing or 0 in {len(lines) - len([r for r in rss if r > 0])} "
                         f"of {len(lines)} invocation lines, e.g. {lines[0]}")
        self.facts.append(f"exec peak_rss_kib of the static handler: {min(rss)}-{max(rss)}")

        # A timeout kills the handler's whole process group: sh and both of its sleeps.
        hang = {}
        t = threading.Thread(target=lambda: hang.update(r=request(port, "POST", "/hang", timeout=60)))
        t.start()
        def hanging():
            sleeps = [p for p in c.ps() if p["args"] in ("sleep 3601", "sleep 3602")]
            return sleeps if len(sleeps) == 2 else None
        group = wait_until("both sleeps of /hang", hanging, 30)
        pgid = {p["pgid"] for p in group}
        if len(pgid) != 1 or 1 in pgid:
            raise Failed(f"the handler's processes are not in one group of their own: {group}")
        t.join(timeout=60)
        if "r" not in hang:
            raise Failed("/hang got no answer")
        err = mismatch("/hang", hang["r"], 504, [JSON, CORS, ("x-runr-error", "timeout")],
                       b'{"error":"handler timed out after 3s"}')
        if err:
            raise Failed(err)
        requests += 1
        wait_until("the /hang group to be killed and reaped", lambda: not [
            p for p in c.ps() if p["pgid"] in pgid], 30)

        # Orphans: a background sleep outlives its handler, is reparented to the wrapper (PID 1)
        # and, once it dies, reaped: no zombie stays.
        orphans = []
        for _ in range(4):
            got = request(port, "POST", "/orphan")
            requests += 1
            if got.status != 200 or not got.body.isdigit():
                raise Failed(f"/orphan answered {got.status} {got.body[:100]!r}")
            orphans.append(int(got.body))
        procs = {p["pid"]: p for p in c.ps()}
        for pid in orphans:
            p = procs.get(pid)
            if p is None or p["ppid"] != 1:
                raise Failed(f"orphan {pid} is not a child of PID 1 after its handler exited: {p}")
        c.exec(c.bundle.busybox, "kill", *map(str, orphans))
        wait_until("the killed orphans to be reaped (no zombie)", lambda: not [
            p for p in c.ps() if p["pid"] in orphans or p["stat"].startswith("Z")], 30)
        # The stress handler's own orphans (2 s each) are gone too, and nothing else is left.
        def only_the_wrapper():
            ps = c.ps()
            return ps if len(ps) == 1 else None
        left = wait_until("every handler process to be gone", only_the_wrapper, 30)
        if left[0]["pid"] != 1:
            raise Failed(f"left in the sandbox: {left}")

        # SIGTERM drains what is in flight: four slow requests still answer, then exit 0.
        slow = []
        ts = [threading.Thread(target=lambda: slow.append(request(port, "POST", "/sleep/1500", timeout=60)))
              for _ in range(4)]
        for t in ts:
            t.start()
        wait_until("four slow handlers to run", lambda: len([
            p for p in c.ps() if "stress_handler" in p["args"]]) == 4, 30)
        c.signal("TERM")
        for t in ts:
            t.join(timeout=DRAIN_GUARD)
        for r in slow:
            # Answered while draining: the connection is not kept.
            err = mismatch("/sleep/1500 across SIGTERM", r, 200,
                           [TEXT, CORS, ("connection", "close")], b"slept")
            if err:
                raise Failed(err)
        if len(slow) != 4:
            raise Failed(f"{4 - len(slow)} of 4 in-flight requests got no answer across SIGTERM")
        requests += 4
        code = c.wait_exit(DRAIN_GUARD)
        if code != 0:
            raise Failed(f"exited {code} after SIGTERM (want 0): {c.tail()}")
        return requests

    # --- exec: function-exec.yaml as it is -----------------------------------------------------
    def exec_bash(self):
        port = free_port()
        env = Env("function-exec.yaml", k8s_container("function-exec.yaml", "function"),
                  {"PORT": str(port)}, "host network: a free port")
        self.note(env)
        code = self.code_dir("exec-bash", config_map("function-exec.yaml"))
        c = self.start(self.bundle("exec-bash", ("host", {}), ["/runr/runr-wrapper"], env,
                                   self.function_mounts(code)))
        c.wait_http(port, headers={"K-Kubelet-Probe": "kube-probe/1.31"})
        paths = [f"/hello/{i}" for i in range(4 * CONCURRENCY)]

        def one(conn, path):
            got = request(port, "GET", path, conn=conn)
            return mismatch(path, got, 200, [TEXT, CORS], f"Hello from bash! You called GET {path}".encode())
        n = drive(port, paths, one)
        # runr-tick (what a WebAssembly function's CronJob runs) in its own FROM scratch root,
        # sending its schedule CloudEvent to this function: the pod sets no RUNR_TRIGGER, so the
        # event's ce-type makes it a schedule invocation and the handler takes its schedule branch.
        t = self.start(Bundle(self.work, "tick", ("scratch", {"/runr-tick": os.path.join(self.dist, "runr-tick")}),
                              ["/runr-tick"], [f"PORT={port}"]))
        code = t.wait_exit()
        if code != 0 or bytes(t.out) != b"tick from bash\n":
            raise Failed(f"runr-tick exited {code} printing {bytes(t.out)[:200]!r}: {t.tail()}")
        c.stop(0)
        return n + 1

    # --- persistent ----------------------------------------------------------------------------
    def persistent(self):
        port = free_port()
        env = Env("knative-persistent.yaml", k8s_container("knative-persistent.yaml", "function"),
                  {"PORT": str(port)}, "Knative sets PORT; here a free port")
        self.note(env)
        code = self.code_dir("persistent", config_map("knative-persistent.yaml"))
        c = self.start(self.bundle("persistent", ("host", {}), ["/runr/runr-wrapper"], env,
                                   self.function_mounts(code)))
        c.wait_http(port, headers={"K-Kubelet-Probe": "kube-probe/1.31"})
        workers = set()
        items = [("POST" if i % 2 else "GET", f"/p/{i}") for i in range(16 * CONCURRENCY)]

        def one(conn, item):
            method, path = item
            got = request(port, method, path, body=b"{}" if method == "POST" else None, conn=conn)
            m = re.match(rb"Hello from worker (\d)!", got.body)
            w = m.group(1).decode() if m else "?"
            workers.add(w)
            return mismatch(f"{method} {path}", got, 200, [TEXT, CORS],
                            f"Hello from worker {w}! You called {method} {path}".encode()) or (
                None if w in ("0", "1") else f"{path}: worker {w}")
        n = drive(port, items, one)
        if workers != {"0", "1"}:
            raise Failed(f"answers came from workers {sorted(workers)}, want both of RUNR_WORKERS=2")
        c.stop(0)
        return n

    # --- http mode: the schedule one-shot and the observed proxy -------------------------------
    def schedule(self):
        port = free_port()
        env = Env("schedule-cronjob.yaml", k8s_container("schedule-cronjob.yaml", "function"),
                  {"PORT": str(port)}, "host network: a free port")
        self.note(env)
        code = self.code_dir("schedule", config_map("schedule-cronjob.yaml"))
        c = self.start(self.bundle("schedule", ("host", {}), ["/runr/runr-wrapper"], env,
                                   self.function_mounts(code)))
        status = c.wait_exit()
        out = bytes(c.out).decode("utf-8", "replace")
        if status != 0 or not re.fullmatch(r"tick [0-9a-zA-Z-]+ at \d{4}-\d\d-\d\dT[\d:.]+Z\n?", out):
            raise Failed(f"the schedule run exited {status} printing {out!r}: {c.tail()}")
        return 1

    def observed(self):
        port, upstream = free_port(), free_port()
        env = Env("schedule-cronjob.yaml", k8s_container("schedule-cronjob.yaml", "function"),
                  {"PORT": str(port), "RUNR_TRIGGER": None, "RUNR_TRACING": "1",
                   "RUNR_UPSTREAM_PORT": str(upstream)},
                  "the same program serving http requests behind the observed proxy")
        self.note(env)
        code = self.code_dir("observed", config_map("schedule-cronjob.yaml"))
        c = self.start(self.bundle("observed", ("host", {}), ["/runr/runr-wrapper"], env,
                                   self.function_mounts(code)))
        c.wait_http(port, headers={"K-Kubelet-Probe": "kube-probe/1.31"})
        server = self.shared["python_server_header"]
        ids = list(range(8 * CONCURRENCY))

        def one(conn, i):
            got = request(port, "POST", f"/obs/{i}", headers={"ce-id": f"id-{i}"}, body=b"{}", conn=conn)
            return mismatch(f"/obs/{i}", got, 200, [TEXT, CORS, ("server", server)],
                            f"tick id-{i} at None".encode())
        n = drive(port, ids, one)

        def access():
            lines = [l for l in c.log() if re.search(r"sampled=true POST /obs/\d+ 200 ", l)]
            return len(lines) == n
        # An access line is written once its answer is sent, so it may trail the answer.
        wait_until(f"{n} access lines", access, 30)
        c.stop(0)
        return n

    # --- lambda --------------------------------------------------------------------------------
    def lambda_mode(self):
        port = free_port()
        # No manifest runs lambda mode; the variables are the README's for a custom runtime.
        env = Env("function-exec.yaml", k8s_container("function-exec.yaml", "function"), {
            "PORT": str(port), "RUNR_WRAPPER_MODE": "lambda", "RUNR_COMMAND": None,
            "RUNR_INPUT": None, "RUNR_HANDLER": "function.handler", "RUNR_WORKERS": "2",
        }, "the exec pod's shape in lambda mode; the bootstrap is found in LAMBDA_TASK_ROOT=/app/code")
        self.note(env)
        code = os.path.join(self.work, "code", "lambda")
        shutil.copytree(os.path.join(FIXTURES, "lambda"), code)
        c = self.start(self.bundle("lambda", ("host", {}), ["/runr/runr-wrapper"], env,
                                   self.function_mounts(code)))
        c.wait_http(port, headers={"K-Kubelet-Probe": "kube-probe/1.31"})
        pids = set()
        paths = [f"/lam/{i}" for i in range(2 * CONCURRENCY)]

        def one(conn, path):
            got = request(port, "GET", path, conn=conn)
            pid = got.header("x-pid") or "?"
            pids.add(pid)
            return mismatch(path, got, 200, [("content-type", "text/plain"), CORS, ("x-pid", pid)],
                            f"shell saw {path}".encode())
        n = drive(port, paths, one)
        bootstraps = {str(p["pid"]) for p in c.ps() if "bootstrap" in p["args"] and p["ppid"] == 1}
        if not pids <= bootstraps or len(bootstraps) != 2:
            raise Failed(f"answers from pids {sorted(pids)}, runtimes in the sandbox {sorted(bootstraps)}")
        c.stop(0)
        return n

    # --- the wrapper when it is not PID 1 ------------------------------------------------------
    def not_pid1(self):
        port = free_port()
        env = self.exec_env(port, "30")
        code = self.exec_code("not-pid1")
        c = self.start(self.bundle("not-pid1", ("busybox", {}),
                                   ["/bin/sh", "-c", "/runr/runr-wrapper; echo wrapper exited $?"],
                                   env, self.function_mounts(code)))
        # Read up to the listening line: a subreaper warning comes before it.
        c.wait_log(r" listening ")
        c.wait_http(port, headers={"K-Kubelet-Probe": "kube-probe/1.31"})
        wrapper = [p for p in c.ps() if p["args"] == "/runr/runr-wrapper"]
        if len(wrapper) != 1 or wrapper[0]["pid"] == 1:
            raise Failed(f"the wrapper is not one process under sh: {c.ps()}")
        wpid = wrapper[0]["pid"]
        warning = [l for l in c.log() if "subreaper" in l]
        got = request(port, "POST", "/orphan")
        orphan = int(got.body) if got.body.isdigit() else None
        procs = {p["pid"]: p for p in c.ps()}
        parent = procs.get(orphan, {}).get("ppid")
        if warning:
            # gVisor 20221219: prctl(PR_SET_CHILD_SUBREAPER) is EINVAL for any process but PID 1.
            w = warning[0]
            if "zombie" not in w or "PID 1" not in w:
                raise Failed(f"the subreaper warning does not say what is lost: {w}")
            if parent != 1:
                raise Failed(f"the warning says orphans go to PID 1, but orphan {orphan}'s parent is {parent}")
            self.facts.append(f"not PID 1: {w}")
        else:
            if parent != wpid:
                raise Failed(f"no subreaper warning, yet the orphan {orphan}'s parent is {parent}, "
                             f"not the wrapper ({wpid})")
            c.exec(c.bundle.busybox, "kill", str(orphan))
            wait_until("the subreaper wrapper to reap its orphan", lambda: orphan not in {
                p["pid"] for p in c.ps()}, 30)
            self.facts.append("not PID 1: the wrapper became a child subreaper and reaped the orphan")
        # To the wrapper itself: sh as PID 1 has no SIGTERM handler, and a namespace's init
        # does not get signals it does not handle (runc; gVisor delivers it).
        c.exec(c.bundle.busybox, "kill", "-TERM", str(wpid))
        c.wait_exit(DRAIN_GUARD)
        if "wrapper exited 0" not in bytes(c.out).decode():
            raise Failed(f"the wrapper under sh did not exit 0 after SIGTERM: {bytes(c.out)!r} {c.tail()}")
        return 1

    # --- the receiver --------------------------------------------------------------------------
    def registry(self, name, extra=""):
        port = free_port()
        conf = os.path.join(self.work, f"{name}.yml")
        with open(conf, "w") as f:
            f.write(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                    f"    rootdirectory: {self.work}/{name}-storage\nhttp:\n  addr: 127.0.0.1:{port}\n{extra}")
        d = self.daemon(name, ["docker-registry", "serve", conf])

        def up():
            if d.proc.poll() is not None:
                raise Failed(f"{name} exited: {d.tail()}")
            try:
                return request(port, "GET", "/v2/", timeout=5).status == 200
            except OSError:
                return False
        wait_until(f"{name} on 127.0.0.1:{port}", up, START_GUARD)
        return port

    def upload(self):
        archive = self.shared["archive"]
        size = os.path.getsize(archive)
        sha = sha256_file(archive)
        self.regport = self.registry("registry")
        port = free_port()
        self.repo = "runr-uploads/platform/runr-tick"
        env = Env("image-receiver.yaml", k8s_container("image-receiver.yaml", "receiver"), {
            "PORT": str(port), "RUNR_UPLOAD_SIZE": str(size), "RUNR_UPLOAD_SHA256": sha,
            "RUNR_UPLOAD_FILENAME": "runr-tick.tar", "RUNR_UPLOAD_NAME": "runr-tick:check",
            "RUNR_UPLOAD_TARGET": f"127.0.0.1:{self.regport}/{self.repo}:check",
        }, "this upload's values; the registry on the host")
        self.note(env)
        mib = -(-2 * size // (1 << 20)) + 64
        c = self.start(self.bundle("upload", ("scratch", {"/runr-image-upload": os.path.join(self.dist, "runr-image-upload")}),
                                   ["/runr-image-upload", "serve"], env, [tmpfs("/work", mib)]))
        c.wait_http(port, "/healthz")
        chunk = 64 << 10
        with open(archive, "rb") as f:
            data = f.read()
        offsets = list(range(0, size, chunk))
        random.Random(7).shuffle(offsets)

        def one(conn, off):
            got = request(port, "PUT", f"/chunk?offset={off}", body=data[off:off + chunk], conn=conn,
                          headers={"Content-Type": "application/octet-stream"})
            return None if got.status // 100 == 2 else f"PUT /chunk?offset={off}: {got.status} {got.body[:200]!r}"
        n = drive(port, offsets, one)
        got = request(port, "POST", "/complete")
        if got.status // 100 != 2:
            raise Failed(f"POST /complete answered {got.status}: {got.body[:300]!r}")

        def finished():
            s = json.loads(request(port, "GET", "/status").body)
            return s if s.get("status") in ("completed", "failed") else None
        status = wait_until("the receiver to finish", finished, 120)
        if status["status"] != "completed":
            raise Failed(f"upload {status['status']}: {json.dumps(status)[:400]}; {c.tail()}")
        # The registry holds the archive's very image: its config byte for byte, and skopeo
        # pulls it back whole (every digest checked) with runr-tick in its layer.
        accept = "application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json"
        m = json.loads(request(self.regport, "GET", f"/v2/{self.repo}/manifests/check",
                               headers={"Accept": accept}).body)
        if m["config"]["digest"] != self.shared["config_digest"]:
            raise Failed(f"pushed config {m['config']['digest']}, the archive's is {self.shared['config_digest']}")
        pulled = os.path.join(self.work, "pulled")
        r = subprocess.run(["skopeo", "--insecure-policy", "copy", "-q", "--src-tls-verify=false",
                            f"docker://127.0.0.1:{self.regport}/{self.repo}:check", f"oci:{pulled}:check"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise Failed(f"skopeo could not pull the pushed image back: {r.stderr.strip()[-300:]}")
        tick = sha256_file(os.path.join(self.dist, "runr-tick"))
        found = False
        for layer in m["layers"]:
            with tarfile.open(os.path.join(pulled, "blobs", "sha256", layer["digest"].split(":")[1])) as t:
                for member in t:
                    if member.name.lstrip("./") == "runr-tick":
                        found = hashlib.sha256(t.extractfile(member).read()).hexdigest() == tick
        if not found:
            raise Failed("the pulled image's layer has no runr-tick identical to the one uploaded")
        self.blobs = [m["config"]["digest"]] + [l["digest"] for l in m["layers"]]
        c.stop(0)
        return n + 1

    # --- prewarm through a pull-through cache --------------------------------------------------
    def prewarm(self):
        if not getattr(self, "blobs", None):
            raise Failed("nothing to warm: the upload check did not push its image")
        cache = self.registry("cache", f"proxy:\n  remoteurl: http://127.0.0.1:{self.regport}\n")
        env = Env("prewarm-job.yaml", k8s_container("prewarm-job.yaml", "prewarm"), {
            "RUNR_PREWARM_REGISTRY": f"localhost:{cache}", "RUNR_PREWARM_IMAGES": f"{self.repo}:check",
        }, "the cache on the host, by name through /etc/hosts; the image the upload pushed")
        self.note(env)
        c = self.start(self.bundle("prewarm", ("scratch", {"/runr-prewarm": os.path.join(self.dist, "runr-prewarm")}),
                                   ["/runr-prewarm", "run"], env))
        code = c.wait_exit(300)
        out = bytes(c.out).decode("utf-8", "replace").strip()
        try:
            summary = json.loads(out.splitlines()[-1])
        except (ValueError, IndexError):
            raise Failed(f"runr-prewarm exited {code} without a JSON summary: {out[:300]!r} {c.tail()}")
        if code != 0 or summary.get("warmed") != 1 or summary.get("failed") != 0:
            raise Failed(f"runr-prewarm exited {code}: {out[:400]} {c.tail()}")
        image = summary["images"][0]
        if image["fetched_bytes"] <= 0 or image["blobs"] != len(self.blobs):
            raise Failed(f"a cold cache should have fetched all {len(self.blobs)} blobs: {out[:400]}")
        store = os.path.join(self.work, "cache-storage", "docker", "registry", "v2", "blobs", "sha256")
        missing = [b for b in self.blobs if not os.path.exists(os.path.join(store, b[7:9], b[7:], "data"))]
        if missing:
            raise Failed(f"the cache does not store {missing} after prewarm said warmed")
        return 1

    # --- the queue consumer and a queue-triggered function -------------------------------------
    def queue(self):
        qport = free_port()
        redis = self.daemon("redis", ["redis-server", "--port", str(qport), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", self.work])

        def cli(*args):
            return subprocess.run(["redis-cli", "-p", str(qport), *args], capture_output=True,
                                  text=True).stdout.strip()
        wait_until("redis-server", lambda: cli("ping") == "PONG" or redis.proc.poll() is not None, START_GUARD)
        fport = free_port()
        fenv = Env("queue-trigger.yaml", k8s_container("queue-trigger.yaml", "function"),
                   {"PORT": str(fport)}, "Knative sets PORT; here a free port")
        self.note(fenv)
        code = self.code_dir("queue", config_map("queue-trigger.yaml"))
        fn = self.start(self.bundle("queue-fn", ("host", {}), ["/runr/runr-wrapper"], fenv,
                                    self.function_mounts(code)))
        pod = "runr-fn-orders-queue-5d8f7c9b4-x2x7q"
        env = Env("queue-trigger.yaml", k8s_container("queue-trigger.yaml", "consumer"), {
            "RUNR_QUEUE_REDIS_URL": f"redis://127.0.0.1:{qport}",
            "RUNR_QUEUE_TARGET": f"http://127.0.0.1:{fport}/",
            "HOSTNAME": pod, "RUNR_QUEUE_LOG": "debug",
        }, "Redis and the function on the host; HOSTNAME as the kubelet sets it; debug logs show each answer")
        self.note(env)
        qc = self.start(self.bundle("queue", ("scratch", {"/runr-queue": os.path.join(self.dist, "runr-queue")}),
                                    ["/runr-queue"], env, hostname=pod))
        fn.wait_http(fport, headers={"K-Kubelet-Probe": "kube-probe/1.31"})
        qc.wait_log(r" consuming ")
        stream, group = env.vars["RUNR_QUEUE_STREAM"], env.vars["RUNR_QUEUE_GROUP"]
        n = 16
        for i in range(n):
            cli("XADD", stream, "*", "msg", f"m{i}")
        # As the log line quotes it (logfmt: the value holds spaces and quotes).
        want = {f'answer="processed {{\\"msg\\":\\"m{i}\\"}} (from bash)"' for i in range(n)}

        def delivered():
            log = "\n".join(qc.log())
            return all(w in log for w in want) and cli("XPENDING", stream, group).splitlines()[0] == "0"
        try:
            wait_until(f"{n} entries delivered and acknowledged", delivered, 60)
        except Failed as e:
            raise Failed(f"{e}; pending {cli('XPENDING', stream, group)!r}; queue: {qc.tail()}; function: {fn.tail()}")
        qc.stop(0)
        fn.stop(0)
        return n

    def note(self, env):
        if self.rt.name == self.first_runtime:
            say(f"  {env.describe()}")


CHECKS = [
    ("install", "init container: runr-wrapper install into an emptyDir", Checks.install),
    ("exec", "exec mode, busybox + static handler: c16, timeout kills the group, orphans reaped, drain", Checks.exec_static),
    ("exec-bash", "exec mode, function-exec.yaml (bash); runr-tick sends it a tick", Checks.exec_bash),
    ("persistent", "persistent mode, knative-persistent.yaml (python workers)", Checks.persistent),
    ("schedule", "http mode one-shot, schedule-cronjob.yaml", Checks.schedule),
    ("observed", "http mode behind the observed proxy", Checks.observed),
    ("lambda", "lambda mode, the bash bootstrap", Checks.lambda_mode),
    ("not-pid1", "the wrapper as a child of sh", Checks.not_pid1),
    ("upload", "runr-image-upload into docker-registry", Checks.upload),
    ("prewarm", "runr-prewarm through a pull-through cache", Checks.prewarm),
    ("queue", "runr-queue from redis-server to an exec function", Checks.queue),
]


# === shared inputs, made once ====================================================================

def prepare(work, dist):
    shared = {}
    pattern_bytes(0, 0)  # made once, outside the timed checks
    # The static handler: musl, no libc needed in the busybox root.
    out = os.path.join(work, "stress_handler")
    subprocess.run(["musl-gcc", "-static", "-O2", "-o", out, os.path.join(FIXTURES, "stress_handler.c")],
                   check=True)
    shared["stress_handler"] = out
    # The python3 the host root gives the http-mode program: its http.server's Server header.
    shared["python_server_header"] = subprocess.run(
        ["/usr/bin/env", f"PATH={PATH}", "python3", "-c",
         "import http.server as h; print(h.BaseHTTPRequestHandler.server_version, h.BaseHTTPRequestHandler.sys_version)"],
        capture_output=True, text=True, check=True).stdout.strip()
    # The upload: a FROM scratch image of runr-tick (a GNU tar layer added by umoci), saved by
    # skopeo as a classic docker-archive (the receiver checks its layers against the config's
    # diff_ids). umoci insert would do, but writes its layer without tar's end-of-archive blocks.
    layout = os.path.join(work, "layout")

    def run(*argv):
        subprocess.run(argv, check=True, capture_output=True)
    run("umoci", "init", "--layout", layout)
    run("umoci", "new", "--image", f"{layout}:check")
    rootfs = os.path.join(work, "image-root")
    os.makedirs(rootfs)
    shutil.copy2(os.path.join(dist, "runr-tick"), os.path.join(rootfs, "runr-tick"))
    layer = os.path.join(work, "layer.tar")
    run("tar", "-C", rootfs, "--owner=0", "--group=0", "--numeric-owner", "-cf", layer, "runr-tick")
    run("umoci", "raw", "add-layer", "--image", f"{layout}:check", layer)
    run("umoci", "config", "--image", f"{layout}:check", "--config.entrypoint", "/runr-tick",
        "--config.user", f"{USER}:{USER}", "--architecture", {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine()))
    archive = os.path.join(work, "runr-tick.tar")
    run("skopeo", "--insecure-policy", "copy", "-q", f"oci:{layout}:check", f"docker-archive:{archive}:runr-tick:check")
    with tarfile.open(archive) as t:
        config = json.load(t.extractfile("manifest.json"))[0]["Config"]
        digest = hashlib.sha256(t.extractfile(config).read()).hexdigest()
    shared["archive"] = archive
    shared["config_digest"] = f"sha256:{digest}"
    return shared


def probe_runsc(work):
    """Whether runsc starts a sandbox here: busybox `true` in a bundle. Raises Skip saying why not."""
    if not shutil.which("runsc"):
        raise Skip("runsc is not installed (Debian: runsc; .ci/run installs it)")
    rt = Runtime("runsc", os.path.join(work, "probe"))
    b = Bundle(os.path.join(work, "probe"), "probe", ("busybox", {}), ["/bin/true"], [f"PATH={PATH}"])
    try:
        r = subprocess.run(rt.cli + ["run", "--bundle", b.dir, f"runr-probe-{os.getpid()}"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        rt.cleanup()
        raise Skip("runsc run of busybox true did not finish in 120 s")
    if r.returncode != 0:
        rt.cleanup()
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise Skip(f"runsc cannot start a sandbox here (runsc --platform=ptrace run of busybox true "
                   f"exited {r.returncode}: {last})")
    return subprocess.run(["runsc", "--version"], capture_output=True, text=True).stdout.splitlines()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    ap.add_argument("--dist", default=os.path.join(ROOT, "target", "dist", machine))
    ap.add_argument("--runtime", action="append", choices=["runsc", "runc"])
    ap.add_argument("--only", action="append", metavar="CHECK",
                    help="run only this check (and what it needs); repeatable")
    a = ap.parse_args()
    runtimes = a.runtime or os.environ.get("RUNR_SANDBOX_RUNTIMES", "runsc").split()
    if not runtimes or set(runtimes) - {"runsc", "runc"}:
        ap.error(f"RUNR_SANDBOX_RUNTIMES={' '.join(runtimes)!r}: runsc, runc or both")

    # check.sh's TERM/INT should still clean up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    skipped = None
    made = []
    failed = []
    times = {}
    names = [c[0] for c in CHECKS]
    wanted = set(a.only or names)
    if wanted - set(names):
        ap.error(f"unknown check {sorted(wanted - set(names))}: one of {', '.join(names)}")
    # What the others stand on: the installed wrapper; prewarm warms what upload pushed.
    wanted |= {"install"} | ({"upload"} if "prewarm" in wanted else set())
    checks = [c for c in CHECKS if c[0] in wanted]
    work = tempfile.mkdtemp(prefix="runr-sandbox.")
    try:
        for tool, why in [("busybox", "busybox-static"), ("musl-gcc", "musl-tools"),
                          ("docker-registry", "docker-registry"), ("skopeo", "skopeo"),
                          ("umoci", "umoci"), ("redis-server", "redis-server"), ("redis-cli", "redis-tools")]:
            if not shutil.which(tool):
                say(f"FAIL: {tool} is not installed (Debian: {why}; .ci/run installs it)")
                return 1
        if "runc" in runtimes and not shutil.which("runc"):
            say("FAIL: runc is not installed (Debian: runc)")
            return 1
        global BASE_SPEC
        BASE_SPEC = base_spec()
        skipped = None
        if "runsc" in runtimes:
            try:
                say(f"runsc starts a sandbox here: {probe_runsc(work)}, platform ptrace, host network")
            except Skip as e:
                say(f"skip: {e}")
                skipped = str(e)
                runtimes.remove("runsc")
        if not runtimes:
            return EXIT_SKIP
        for b in ("runr-wrapper", "runr-tick", "runr-image-upload", "runr-prewarm", "runr-queue"):
            if not os.access(os.path.join(a.dist, b), os.X_OK):
                say(f"FAIL: {a.dist}/{b} is missing: run deploy/build.sh binaries first")
                return 1
        shared = prepare(work, a.dist)
        for rt_name in runtimes:
            rt = Runtime(rt_name, work)
            ch = Checks(rt, work, a.dist, shared, runtimes[0])
            made.append(ch)
            for name, what, fn in checks:
                say(f"{rt_name}: {name}: {what}")
                start = time.monotonic()
                try:
                    if name != "install" and ch.runr is None:
                        raise Failed("the wrapper was not installed (see install)")
                    n = fn(ch)
                    times[(rt_name, name)] = (n, time.monotonic() - start)
                    say(f"{rt_name}: {name}: ok, {n} request(s), {time.monotonic() - start:.1f}s")
                except Exception as e:  # one check's surprise must not hide the others' results
                    times[(rt_name, name)] = (None, time.monotonic() - start)
                    msg = str(e) if isinstance(e, Failed) else f"{type(e).__name__}: {e}"
                    failed.append(f"{rt_name}: {name}: {msg}")
                    say(f"FAIL: {rt_name}: {name}: {msg}")
                finally:
                    ch.close()
            for f in ch.facts:
                say(f"{rt_name}: {f}")
    except (Failed, subprocess.CalledProcessError) as e:
        detail = e.stderr.decode(errors="replace").strip()[-300:] if getattr(e, "stderr", None) else ""
        say(f"FAIL: preparing the bundles: {e} {detail}")
        return 1
    finally:
        for ch in made:
            ch.close_all()
            ch.rt.cleanup()
        if os.environ.get("RUNR_SANDBOX_KEEP") == "1":
            say(f"kept {work} (RUNR_SANDBOX_KEEP=1)")
        else:
            shutil.rmtree(work, ignore_errors=True)

    cols = runtimes
    say("")
    say(f"{'check':<12} {'requests':>8}  " + "  ".join(f"{c + ' s':>9}" for c in cols))
    totals = {c: 0.0 for c in cols}
    for name, _, _ in checks:
        row = []
        reqs = ""
        for c in cols:
            n, s = times.get((c, name), (None, 0.0))
            totals[c] += s
            row.append(f"{s:9.1f}" if n is not None else f"{'FAIL':>9}")
            reqs = reqs or (str(n) if n is not None else "")
        say(f"{name:<12} {reqs:>8}  " + "  ".join(row))
    say(f"{'total':<12} {'':>8}  " + "  ".join(f"{totals[c]:9.1f}" for c in cols))
    if failed:
        say(f"{len(failed)} check(s) failed")
        return 1
    if skipped:
        say(f"all {' and '.join(runtimes)} checks passed; runsc skipped: {skipped}")
        return EXIT_SKIP
    say("all sandbox checks passed")
    return 0


BASE_SPEC = None

if __name__ == "__main__":
    sys.exit(main())
