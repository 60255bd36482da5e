#!/usr/bin/env python3
"""Offline validation of deploy/k8s: no cluster, no network.

usage: deploy/validate-manifests.py [DIR]   (default: deploy/k8s next to this script)

1. Every built-in resource is checked against the Kubernetes OpenAPI schemas bundled in the
   `kubernetes-validate` package (strict: unknown fields are errors), at its newest version.
2. kubernetes-validate has no CRD schemas, so a Knative Service (serving.knative.dev/v1) is
   checked in two parts instead of being skipped: its envelope against the minimal schema below
   (the Knative fields RunR uses), and its revision template as a core PodTemplate (strict) after
   removing the Knative-only revision fields. Any other kind without a schema is an error, so
   nothing ships unvalidated.
3. kustomization.yaml: every manifest file is listed, every listed file exists, every RunR image
   of the manifests has an `images` entry, and all carry the workspace version as tag.
4. What the spec requires and a schema cannot say: the receiver's security context and /work
   sizing, the wrapper's init container and /runr emptyDir, the prewarm variables, the queue
   consumer's variables and that its target is a Knative Service of these manifests, and that
   every RUNR_* variable set is one the binary in that container reads (its crates' sources name
   it).

Prints one line per resource and check; exits 1 when anything fails.
"""

import os
import re
import sys

try:
    import jsonschema
    import kubernetes_validate
    import yaml
except ImportError as e:
    sys.exit(
        f"FAIL  {e.name} is not installed for {sys.executable} "
        "(python3 -m pip install -r tests/requirements.txt; .ci/run does it)"
    )

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
IMAGE_PREFIX = "ghcr.io/brf-tech/runr/"

# Fields a Knative RevisionSpec adds to the core PodSpec (serving.knative.dev/v1).
KNATIVE_REVISION_FIELDS = {
    "containerConcurrency": {"type": "integer", "minimum": 0, "maximum": 1000},
    "timeoutSeconds": {"type": "integer", "minimum": 0},
    "responseStartTimeoutSeconds": {"type": "integer", "minimum": 0},
    "idleTimeoutSeconds": {"type": "integer", "minimum": 0},
}

# The envelope of a Knative Service as far as these manifests use it; the pod part is checked
# against the core schema separately.
KNATIVE_SERVICE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "serving.knative.dev/v1"},
        "kind": {"const": "Service"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            "additionalProperties": False,
        },
        "spec": {
            "type": "object",
            "required": ["template"],
            "additionalProperties": False,
            "properties": {
                "template": {
                    "type": "object",
                    "required": ["spec"],
                    "additionalProperties": False,
                    "properties": {
                        "metadata": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                "labels": {
                                    "type": "object",
                                    "additionalProperties": {"type": "string"},
                                },
                                "annotations": {
                                    "type": "object",
                                    "additionalProperties": {"type": "string"},
                                },
                            },
                            "additionalProperties": False,
                        },
                        "spec": {
                            "type": "object",
                            "required": ["containers"],
                            "properties": KNATIVE_REVISION_FIELDS,
                        },
                    },
                },
                "traffic": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "revisionName": {"type": "string"},
                            "configurationName": {"type": "string"},
                            "latestRevision": {"type": "boolean"},
                            "percent": {"type": "integer", "minimum": 0, "maximum": 100},
                            "tag": {"type": "string"},
                        },
                        "additionalProperties": False,
                    },
                },
            },
        },
    },
}


class Report:
    def __init__(self):
        self.failures = 0

    def ok(self, what):
        print(f"ok    {what}")

    def fail(self, what):
        self.failures += 1
        print(f"FAIL  {what}")

    def check(self, cond, what):
        (self.ok if cond else self.fail)(what)


def name_of(doc):
    return f"{doc.get('kind', '?').lower()}/{doc.get('metadata', {}).get('name', '?')}"


def workspace_version():
    text = open(os.path.join(ROOT, "Cargo.toml")).read()
    section = text.split("[workspace.package]", 1)[1].split("\n[", 1)[0]
    return re.search(r'^version\s*=\s*"([^"]+)"', section, re.M).group(1)


def validate_core(doc, version, where, rep):
    try:
        kubernetes_validate.validate(doc, version, strict=True)
        rep.ok(f"{where}: {name_of(doc)} matches the Kubernetes {version} schema (strict)")
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        rep.fail(f"{where}: {name_of(doc)}: {path}: {e.message}")


def validate_knative_service(doc, version, where, rep):
    try:
        jsonschema.Draft202012Validator(KNATIVE_SERVICE_SCHEMA).validate(doc)
    except jsonschema.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        rep.fail(f"{where}: {name_of(doc)}: {path}: {e.message} (bundled Knative Service schema)")
        return
    template = doc["spec"]["template"]
    pod_spec = {k: v for k, v in template["spec"].items() if k not in KNATIVE_REVISION_FIELDS}
    as_pod_template = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": doc["metadata"]["name"]},
        "template": {"metadata": template.get("metadata", {}), "spec": pod_spec},
    }
    try:
        kubernetes_validate.validate(as_pod_template, version, strict=True)
        rep.ok(
            f"{where}: {name_of(doc)} (Knative) matches the bundled Service schema, and its "
            f"revision template the Kubernetes {version} PodTemplate schema (strict)"
        )
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        rep.fail(f"{where}: {name_of(doc)} (Knative): spec.{path}: {e.message}")


def pod_spec_of(doc):
    kind = doc.get("kind")
    spec = doc.get("spec", {})
    if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return spec["template"]["spec"]
    if kind == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    if kind == "Service" and doc.get("apiVersion", "").startswith("serving.knative.dev/"):
        return spec["template"]["spec"]
    return None


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def quantity_mi(q):
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", str(q))
    if not m:
        return None
    n = int(m.group(1))
    return n * units[m.group(2)] if m.group(2) else n / (1024 * 1024)


def hardened(container, pod, who, rep):
    sc = container.get("securityContext", {})
    psc = pod.get("securityContext", {})
    rep.check(
        sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True
        and sc.get("readOnlyRootFilesystem") is True
        and sc.get("allowPrivilegeEscalation") is False
        and sc.get("capabilities", {}).get("drop") == ["ALL"]
        and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault"
        and pod.get("automountServiceAccountToken") is False,
        f"{who}: runAsNonRoot, readOnlyRootFilesystem, no capabilities, no privilege escalation, "
        "seccomp RuntimeDefault, no service account token",
    )


def check_policies(doc, path, where, rep):
    pod = pod_spec_of(doc)
    if pod is None:
        return
    who = f"{where}: {name_of(doc)}"
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    containers = pod.get("containers", [])

    # Functions: the wrapper arrives through the init container into an emptyDir at /runr.
    if any(c.get("command") == ["/runr/runr-wrapper"] for c in containers):
        inits = [c for c in pod.get("initContainers", []) if c["image"].startswith(IMAGE_PREFIX + "wrapper:")]
        rep.check(
            len(inits) == 1 and inits[0].get("args") == ["install", "/runr/runr-wrapper"],
            f"{who}: init container runs `runr-wrapper install /runr/runr-wrapper`",
        )
        mounts = [m for m in inits[0].get("volumeMounts", []) if m["mountPath"] == "/runr"] if inits else []
        rep.check(
            len(mounts) == 1 and "emptyDir" in volumes.get(mounts[0]["name"], {}),
            f"{who}: /runr is an emptyDir shared with the function container",
        )
        for c in containers:
            env = env_of(c)
            rep.check(
                env.get("RUNR_WRAPPER_MODE") in ("exec", "persistent", "http")
                and isinstance(yaml.safe_load(env.get("RUNR_COMMAND") or "null"), list),
                f"{who}: RUNR_WRAPPER_MODE is a mode and RUNR_COMMAND a JSON array",
            )
        for c in pod.get("initContainers", []) + containers:
            hardened(c, pod, f"{who} container {c['name']}", rep)

    for c in containers:
        image = c.get("image", "")
        if image.startswith(IMAGE_PREFIX + "image-upload:"):
            env = env_of(c)
            hardened(c, pod, f"{who} (receiver)", rep)
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            work = volumes.get(mounts.get("/work", ""), {}).get("emptyDir")
            size = int(env.get("RUNR_UPLOAD_SIZE") or 0)
            want = 2 * size / (1024 * 1024) + 512
            got = quantity_mi((work or {}).get("sizeLimit", ""))
            rep.check(
                work is not None and env.get("RUNR_UPLOAD_DIR") == "/work" and got == want,
                f"{who} (receiver): emptyDir /work sized 2 x RUNR_UPLOAD_SIZE + 512 Mi "
                f"(want {want:g} Mi, have {got} Mi)",
            )
            rep.check(
                all(env.get(k) for k in ("RUNR_UPLOAD_TARGET", "RUNR_UPLOAD_SIZE"))
                and re.fullmatch(r"[0-9a-f]{64}", env.get("RUNR_UPLOAD_SHA256") or "") is not None,
                f"{who} (receiver): RUNR_UPLOAD_TARGET, RUNR_UPLOAD_SIZE and a hex RUNR_UPLOAD_SHA256 set",
            )
            rep.check(
                "runtimeClassName" in open(path).read(),
                f"{who} (receiver): runtimeClassName is documented (commented) for gVisor/Kata",
            )
        if image.startswith(IMAGE_PREFIX + "queue:"):
            names = {e["name"] for e in c.get("env", [])}
            hardened(c, pod, f"{who} (queue)", rep)
            rep.check(
                {"RUNR_QUEUE_REDIS_URL", "RUNR_QUEUE_STREAM", "RUNR_QUEUE_GROUP", "RUNR_QUEUE_TARGET"} <= names,
                f"{who} (queue): RUNR_QUEUE_REDIS_URL, RUNR_QUEUE_STREAM, RUNR_QUEUE_GROUP and RUNR_QUEUE_TARGET set",
            )
            rep.check(
                int(pod.get("terminationGracePeriodSeconds", 30)) > 25,
                f"{who} (queue): the grace period outlasts the 25 s drain",
            )
        if image.startswith(IMAGE_PREFIX + "prewarm:"):
            env = env_of(c)
            hardened(c, pod, f"{who} (prewarm)", rep)
            rep.check(
                bool(env.get("RUNR_PREWARM_REGISTRY")) and bool((env.get("RUNR_PREWARM_IMAGES") or "").strip()),
                f"{who} (prewarm): RUNR_PREWARM_REGISTRY and RUNR_PREWARM_IMAGES set",
            )


# Which crates read the environment of a container, by what runs in it.
CRATES_OF = {
    "wrapper": ["wrapper", "tick"],
    "image-upload": ["image-receiver", "registry"],
    "prewarm": ["prewarm", "registry"],
    "queue": ["queue"],
}


def variables_read_by(crates):
    """Every "RUNR_..." / "PORT" string literal in the crates' sources: the variables they know."""
    names = set()
    for crate in crates:
        for base, _, files in os.walk(os.path.join(ROOT, crate, "src")):
            for f in files:
                if f.endswith(".rs"):
                    text = open(os.path.join(base, f), encoding="utf-8").read()
                    names.update(re.findall(r'"(RUNR_[A-Z0-9_]+|PORT)"', text))
    return names


def check_variables(doc, where, rep):
    """A RUNR_* variable in a manifest that no binary reads is a typo that fails silently."""
    pod = pod_spec_of(doc)
    if pod is None:
        return
    for c in pod.get("containers", []):
        image = c.get("image", "")
        if c.get("command") == ["/runr/runr-wrapper"]:
            kind = "wrapper"
        elif image.startswith(IMAGE_PREFIX):
            kind = image[len(IMAGE_PREFIX):].split(":", 1)[0]
        else:
            continue
        if kind not in CRATES_OF:
            continue
        known = variables_read_by(CRATES_OF[kind])
        names = [e["name"] for e in c.get("env", []) if e["name"].startswith("RUNR_") or e["name"] == "PORT"]
        unknown = [n for n in names if n not in known]
        rep.check(
            not unknown,
            f"{where}: {name_of(doc)} container {c['name']}: every RUNR_* variable is read by "
            f"{'/'.join(CRATES_OF[kind])}" + (f" (unknown: {', '.join(unknown)})" if unknown else ""),
        )


def runr_images(doc):
    """Every image reference under ghcr.io/brf-tech/runr/ in a resource, wherever it is."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "image" and isinstance(v, str) and v.startswith(IMAGE_PREFIX):
                    found.append(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    return found


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "k8s")
    version = kubernetes_validate.latest_version()
    rep = Report()
    files = sorted(f for f in os.listdir(directory) if f.endswith((".yaml", ".yml")))
    manifests = [f for f in files if f != "kustomization.yaml"]
    images = set()
    knative_services = set()
    queue_targets = []
    for f in manifests:
        path = os.path.join(directory, f)
        where = os.path.relpath(path, ROOT)
        try:
            docs = [d for d in yaml.safe_load_all(open(path)) if d]
        except yaml.YAMLError as e:
            rep.fail(f"{where}: not YAML: {e}")
            continue
        for doc in docs:
            api = doc.get("apiVersion", "")
            if api.startswith("serving.knative.dev/") and doc.get("kind") == "Service":
                validate_knative_service(doc, version, where, rep)
            else:
                try:
                    validate_core(doc, version, where, rep)
                except kubernetes_validate.SchemaNotFoundError as e:
                    rep.fail(f"{where}: {name_of(doc)}: {e.message} (no schema: not allowed here)")
            check_policies(doc, path, where, rep)
            check_variables(doc, where, rep)
            images.update(runr_images(doc))
            if api.startswith("serving.knative.dev/") and doc.get("kind") == "Service":
                knative_services.add(doc["metadata"]["name"])
            for c in (pod_spec_of(doc) or {}).get("containers", []):
                if c.get("image", "").startswith(IMAGE_PREFIX + "queue:"):
                    queue_targets.append((f"{where}: {name_of(doc)}", env_of(c).get("RUNR_QUEUE_TARGET") or ""))

    # A queue consumer delivers to a function: its target must be one of the Knative Services here.
    for who, target in queue_targets:
        host = re.sub(r"^http://", "", target).split("/", 1)[0].split(":", 1)[0]
        rep.check(
            target.startswith("http://") and host.split(".", 1)[0] in knative_services,
            f"{who} (queue): RUNR_QUEUE_TARGET {target} is a Knative Service of these manifests",
        )

    kpath = os.path.join(directory, "kustomization.yaml")
    if os.path.exists(kpath):
        k = yaml.safe_load(open(kpath))
        listed = k.get("resources", [])
        rep.check(sorted(listed) == manifests, f"kustomization.yaml lists every manifest ({', '.join(manifests)})")
        tags = {i["name"]: i.get("newTag") for i in k.get("images", [])}
        wanted = {ref.rsplit(":", 1)[0] for ref in images}
        rep.check(set(tags) == wanted, f"kustomization.yaml has an images entry for each RunR image ({', '.join(sorted(wanted))})")
        ver = workspace_version()
        rep.check(
            all(t == ver for t in tags.values()) and all(ref.rsplit(":", 1)[1] == ver for ref in images),
            f"RunR images are tagged with the workspace version {ver}",
        )
    else:
        rep.fail(f"{os.path.relpath(kpath, ROOT)} is missing")

    if rep.failures:
        print(f"{rep.failures} manifest check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
