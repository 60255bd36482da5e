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
3. KEDA's resources (keda.sh/v1alpha1 ScaledObject, TriggerAuthentication) against KEDA's own CRD
   schemas, vendored in deploy/schemas/ (source and license there), made strict: an object with
   `properties` accepts no other field (the API server would prune a typo silently). The CRD's
   CEL rule (minReplicaCount <= maxReplicaCount) is checked by hand. Then the recipe's sense: it
   scales a queue consumer of these manifests, on the lag of that consumer's own stream and
   group, through a TriggerAuthentication of these manifests, and the group is created ahead (an
   init container running `runr-queue create-group`) at a start that is not `$`.
4. kustomization.yaml: every manifest file is listed, every listed file exists, every RunR image
   of the manifests has an `images` entry, and all carry the workspace version as tag.
5. What the spec requires and a schema cannot say: the receiver's security context and /work
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
SCHEMAS = os.path.join(HERE, "schemas")
# The custom resources checked against a vendored CRD: (group, kind) -> file in deploy/schemas.
CRDS = {
    ("keda.sh", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("keda.sh", "TriggerAuthentication"): "keda.sh_triggerauthentications.yaml",
}
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


def strict(node):
    """The CRD's schema with `additionalProperties: false` on every object that lists its
    `properties` (and does not say it keeps unknown fields): unknown fields become errors."""
    if isinstance(node, dict):
        out = {k: strict(v) for k, v in node.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def crd_schema(group, kind, version):
    """The strict openAPIV3Schema of `version` in the vendored CRD of (group, kind), or None."""
    path = os.path.join(SCHEMAS, CRDS[(group, kind)])
    crd = yaml.safe_load(open(path))
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["group"] == group
    assert crd["spec"]["names"]["kind"] == kind
    for v in crd["spec"]["versions"]:
        if v["name"] == version and v.get("served", True):
            return strict(v["schema"]["openAPIV3Schema"])
    return None


def is_crd_resource(doc):
    api = doc.get("apiVersion", "")
    return (api.split("/", 1)[0], doc.get("kind")) in CRDS


def validate_crd_resource(doc, where, rep):
    group, version = doc["apiVersion"].split("/", 1)
    kind = doc["kind"]
    source = f"deploy/schemas/{CRDS[(group, kind)]}"
    schema = crd_schema(group, kind, version)
    if schema is None:
        rep.fail(f"{where}: {name_of(doc)}: {source} serves no version {version}")
        return
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    name = doc.get("metadata", {}).get("name", "")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name):
        rep.fail(f"{where}: {name_of(doc)}: metadata.name is not a DNS subdomain name")
    for e in errors:
        path = ".".join(str(p) for p in e.path)
        rep.fail(f"{where}: {name_of(doc)}: {path}: {e.message} ({source}, strict)")
    if not errors:
        rep.ok(f"{where}: {name_of(doc)} matches {kind} {version} of {source} (strict)")
    if kind == "ScaledObject":
        spec = doc.get("spec", {})
        lo, hi = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
        rep.check(lo <= hi, f"{where}: {name_of(doc)}: minReplicaCount <= maxReplicaCount (the CRD's CEL rule)")


def check_keda(docs, rep):
    """A ScaledObject of these manifests scales a queue consumer of these manifests on its own
    stream and group, lag-based, authenticated by a TriggerAuthentication of these manifests, and
    the group is created ahead at a start that is not `$` (else the backlog that scaled it from
    zero would be skipped)."""
    deployments = {d["metadata"]["name"]: d for _, d in docs if d.get("kind") == "Deployment"}
    auths = {d["metadata"]["name"] for _, d in docs if d.get("kind") == "TriggerAuthentication"}
    for where, so in docs:
        if so.get("kind") != "ScaledObject":
            continue
        who = f"{where}: {name_of(so)}"
        ref = so["spec"]["scaleTargetRef"]
        target = deployments.get(ref.get("name")) if ref.get("kind", "Deployment") == "Deployment" else None
        pod = pod_spec_of(target) if target else {}
        queue = [c for c in (pod or {}).get("containers", []) if c.get("image", "").startswith(IMAGE_PREFIX + "queue:")]
        rep.check(len(queue) == 1, f"{who}: scales Deployment {ref.get('name')}, a queue consumer of these manifests")
        if len(queue) != 1:
            continue
        env = env_of(queue[0])
        stream, group = env.get("RUNR_QUEUE_STREAM"), env.get("RUNR_QUEUE_GROUP")
        triggers = so["spec"]["triggers"]
        rep.check(
            all(
                t["type"] == "redis-streams"
                and t["metadata"].get("stream") == stream
                and t["metadata"].get("consumerGroup") == group
                for t in triggers
            ),
            f"{who}: every trigger is redis-streams on the consumer's stream {stream} and group {group}",
        )
        rep.check(
            any(int(t["metadata"].get("lagCount", "0")) > 0 for t in triggers),
            f"{who}: scales on the group's lag (lagCount)",
        )
        rep.check(
            all(t.get("authenticationRef", {}).get("name") in auths for t in triggers),
            f"{who}: every trigger's authenticationRef is a TriggerAuthentication of these manifests",
        )
        inits = [
            c
            for c in pod.get("initContainers", [])
            if c.get("image", "").startswith(IMAGE_PREFIX + "queue:") and c.get("args") == ["create-group"]
        ]
        init_env = env_of(inits[0]) if inits else {}
        rep.check(
            len(inits) == 1
            and init_env.get("RUNR_QUEUE_STREAM") == stream
            and init_env.get("RUNR_QUEUE_GROUP") == group
            and init_env.get("RUNR_QUEUE_START", "$") != "$"
            and env.get("RUNR_QUEUE_START", "$") != "$",
            f"{who}: the group is created ahead (init container `runr-queue create-group` on the same "
            "stream and group) and RUNR_QUEUE_START is not $ there or in the consumer",
        )


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
            for init in pod.get("initContainers", []):
                if init.get("image", "").startswith(IMAGE_PREFIX + "queue:"):
                    hardened(init, pod, f"{who} (queue init container {init['name']})", rep)
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
    for c in pod.get("initContainers", []) + pod.get("containers", []):
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
    all_docs = []
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
            all_docs.append((where, doc))
            if api.startswith("serving.knative.dev/") and doc.get("kind") == "Service":
                validate_knative_service(doc, version, where, rep)
            elif is_crd_resource(doc):
                validate_crd_resource(doc, where, rep)
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

    check_keda(all_docs, rep)

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
