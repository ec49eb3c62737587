"""Kubernetes pods as the runner's sandboxes: one pod per run attempt, from a pod template
the operator owns.

``start`` creates the pod (the template's image, resources, service account, node
selector and security context; our labels and annotations added; ``restartPolicy:
Never``: a container that restarted has lost its scratch), then watches it until its
container runs, within a deadline. A pod that will not run is deleted and the failure
named: the image cannot be pulled (PodImagePull), no node takes it (PodUnschedulable, at
the deadline), the node evicted it or it failed (PodEvicted), it was deleted under us
(PodDeleted), or it did not run in time (PodStartTimeout).

``stop`` deletes the pod (after its teardown banked). ``orphans`` lists the run's pods
by label that this provider did not start: those a runner whose lease lapsed left (the
runner calls it under the run's lease, before its claim, and banks what is running).
Pods that are not running any more are deleted on the spot: nothing in them can be
banked.

Every call carries a deadline (``_request_timeout``). The permissions it needs, beyond
the exec path's ``pods`` get and ``pods/exec`` create: ``pods`` create, delete, list,
watch (deploy/rbac.yaml; tests/rules/test_P_engines.py checks each one).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any, cast

from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from scratchbank.application.ports import Sandbox
from scratchbank.domain.errors import (
    ConfigInvalid,
    PodDeleted,
    PodEvicted,
    PodImagePull,
    PodStartTimeout,
    PodUnschedulable,
    SandboxGone,
    SandboxNotStarted,
    ScratchbankError,
)
from scratchbank.domain.runs import check_run_id

from .k8s_sandbox import KubernetesSandbox, tried_once

MANAGED = "app.kubernetes.io/managed-by"
RUN_LABEL = "scratchbank.io/run"
ATTEMPT_LABEL = "scratchbank.io/attempt"
#: The full run id and attempt (a label value holds 63 characters; a run id 128).
RUN_ANNOTATION = "scratchbank.io/run-id"
ATTEMPT_ANNOTATION = "scratchbank.io/attempt-id"
IMAGE_PULL = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")

#: The RBAC the provider needs on ``pods`` and ``pods/exec`` in its namespace (deploy/rbac.yaml).
NEEDS = frozenset(
    {
        ("pods", "create"),
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods", "delete"),
        ("pods/exec", "create"),
    }
)


def label_value(text: str) -> str:
    """``text`` when it is a valid label value, else a digest of it (``h-`` and 40 hex)."""
    if _LABEL_VALUE.fullmatch(text):
        return text
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:40]


def pod_name(run_id: str) -> str:
    """A DNS-1123 name: ``sb-``, the run id folded to lower case (40 characters), a suffix."""
    slug = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")[:40].strip("-") or "run"
    return f"sb-{slug}-{uuid.uuid4().hex[:8]}"


def check_template(template: Mapping[str, Any], container: str | None) -> None:
    """A pod template has a spec with containers (and the one named, if one is): else ConfigInvalid."""
    spec = template.get("spec") if isinstance(template, Mapping) else None
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if (
        not isinstance(containers, list)
        or not containers
        or not all(isinstance(c, Mapping) for c in containers)
    ):
        raise ConfigInvalid("the pod template has no spec.containers (a Pod manifest is expected)")
    names = [c.get("name") for c in containers]
    if container is not None and container not in names:
        raise ConfigInvalid(f"the pod template has no container {container!r} (it has {names})")
    kind = template.get("kind", "Pod")
    if kind != "Pod":
        raise ConfigInvalid(f"the pod template is a {kind!r}, not a Pod")


def pod_manifest(template: Mapping[str, Any], name: str, run_id: str, attempt: str | None) -> dict[str, Any]:
    """The template, named, labelled with the run and attempt, never restarted."""
    pod: dict[str, Any] = copy.deepcopy(dict(template))
    pod.update(apiVersion="v1", kind="Pod")
    meta = pod.setdefault("metadata", {})
    for key in ("generateName", "namespace", "resourceVersion", "uid"):
        meta.pop(key, None)
    meta["name"] = name
    labels = meta.setdefault("labels", {})
    labels.update({MANAGED: "scratchbank", RUN_LABEL: label_value(run_id)})
    annotations = meta.setdefault("annotations", {})
    annotations[RUN_ANNOTATION] = run_id
    if attempt:
        labels[ATTEMPT_LABEL] = label_value(attempt)
        annotations[ATTEMPT_ANNOTATION] = attempt
    pod["spec"]["restartPolicy"] = "Never"  # a restarted container has lost its scratch
    return pod


def judge(pod: Any, container: str | None) -> str:
    """``running``, ``waiting``, ``unschedulable``; or the named failure, raised."""
    status = pod.status
    name = pod.metadata.name
    phase = getattr(status, "phase", None) or "Pending"
    reason, message = getattr(status, "reason", None) or "", getattr(status, "message", None) or ""
    if phase in ("Failed", "Succeeded"):
        if reason == "Evicted":
            raise PodEvicted(f"pod {name} was evicted: {message}"[:500])
        raise PodEvicted(f"pod {name} ended ({phase}{': ' + reason if reason else ''}) before it ran"[:500])
    for cs in getattr(status, "container_statuses", None) or []:
        if container is not None and cs.name != container:
            continue
        waiting = getattr(cs.state, "waiting", None) if cs.state is not None else None
        if waiting is not None and waiting.reason in IMAGE_PULL:
            raise PodImagePull(f"pod {name}: {waiting.reason}: {waiting.message or ''}"[:500])
        if cs.state is not None and cs.state.terminated is not None:
            raise PodEvicted(f"pod {name}: its container ended ({cs.state.terminated.reason})"[:500])
        if phase == "Running" and cs.state is not None and cs.state.running is not None:
            return "running"
        if container is None:
            break
    for cond in getattr(status, "conditions", None) or []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            return "unschedulable"
    return "waiting"


#: A start watches in windows this long, reading the pod between them (a pod deleted before
#: its watch began sends no event).
WATCH_WINDOW_SECONDS = 5.0
#: A watch's read waits this much past its window (the server ends the window itself), so a
#: start that a stalled API server holds ends this close to its deadline (P8).
WATCH_GRACE_SECONDS = 1.0


class KubernetesSandboxProvider:
    """Pods in ``namespace`` from ``template`` (a Pod manifest as a mapping)."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        namespace: str,
        template: Mapping[str, Any],
        scratch: str,
        container: str | None = None,
        start_seconds: float = 120.0,
        request_seconds: float = 30.0,
    ) -> None:
        check_template(template, container)
        self.api_client, self.namespace, self.template = api_client, namespace, template
        self.scratch, self.container = scratch, container
        self.start_seconds, self.request_seconds = start_seconds, request_seconds
        self.core = k8s.CoreV1Api(tried_once(api_client))
        self.started: set[str] = set()

    # -- start ----------------------------------------------------------------------------
    def start(self, run_id: str, attempt: str | None = None) -> Sandbox:
        name = pod_name(check_run_id(run_id))
        body = pod_manifest(self.template, name, run_id, attempt)
        try:
            self.core.create_namespaced_pod(
                self.namespace, cast(Any, body), _request_timeout=self.request_seconds
            )
        except ApiException as error:
            raise SandboxNotStarted(f"cannot create pod {self.namespace}/{name}: {_said(error)}") from None
        except Exception as error:  # urllib3: refused, timed out
            raise SandboxNotStarted(f"cannot create pod {self.namespace}/{name}: {error}"[:500]) from None
        self.started.add(name)
        try:
            self._wait_running(name)
            return self._sandbox(name)
        except BaseException:
            self._delete(name, quiet=True)
            raise

    def _wait_running(self, name: str) -> None:
        """Watch the pod until its container runs; the named failure, or the deadline's."""
        end = time.monotonic() + self.start_seconds
        seen = "waiting"
        while (left := end - time.monotonic()) > 0:
            stream = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for event in stream.stream(  # type: ignore[no-untyped-call]
                    self.core.list_namespaced_pod,
                    self.namespace,
                    field_selector=f"metadata.name={name}",
                    timeout_seconds=max(1, int(min(left, WATCH_WINDOW_SECONDS))),
                    _request_timeout=min(left, WATCH_WINDOW_SECONDS) + WATCH_GRACE_SECONDS,
                ):
                    if event["type"] == "DELETED":
                        raise PodDeleted(f"pod {self.namespace}/{name} was deleted while it started")
                    if event["type"] == "ERROR":
                        break  # e.g. 410 Gone: watch again
                    seen = judge(event["object"], self.container)
                    if seen == "running":
                        return
                    if time.monotonic() >= end:
                        break
            except ScratchbankError:
                raise
            except ApiException as error:
                raise SandboxNotStarted(f"cannot watch pod {self.namespace}/{name}: {_said(error)}") from None
            except Exception:  # a dropped or timed-out watch (urllib3's errors): watch again
                if time.monotonic() >= end:
                    break
            finally:
                stream.stop()  # type: ignore[no-untyped-call]
            self._still_there(name)
        if seen == "unschedulable":
            raise PodUnschedulable(f"pod {self.namespace}/{name} found no node in {self.start_seconds:g} s")
        raise PodStartTimeout(f"pod {self.namespace}/{name} did not run within {self.start_seconds:g} s")

    def _still_there(self, name: str) -> None:
        """Between watch windows: a watch started after the pod was deleted shows nothing (its
        list is empty, so no DELETED comes), so the pod is read; gone is PodDeleted."""
        try:
            self.core.read_namespaced_pod(name, self.namespace, _request_timeout=self.request_seconds)
        except ApiException as error:
            if error.status == 404:
                raise PodDeleted(f"pod {self.namespace}/{name} was deleted while it started") from None
        except Exception:  # a read that fails says nothing; the next window watches again
            pass

    def _sandbox(self, name: str) -> KubernetesSandbox:
        return KubernetesSandbox(
            name,
            namespace=self.namespace,
            container=self.container,
            scratch=self.scratch,
            api_client=self.api_client,
            request_seconds=self.request_seconds,
        )

    # -- stop and sweep ---------------------------------------------------------------------
    def stop(self, sandbox: Sandbox) -> None:
        if not isinstance(sandbox, KubernetesSandbox):
            raise TypeError(f"not a pod sandbox: {sandbox!r}")
        self._delete(sandbox.pod, quiet=False)

    def _delete(self, name: str, *, quiet: bool) -> None:
        try:
            self.core.delete_namespaced_pod(
                name, self.namespace, grace_period_seconds=0, _request_timeout=self.request_seconds
            )
        except ApiException as error:
            if error.status != 404 and not quiet:
                raise SandboxGone(f"cannot delete pod {self.namespace}/{name}: {_said(error)}") from None
        except Exception as error:
            if not quiet:
                raise SandboxGone(f"cannot delete pod {self.namespace}/{name}: {error}"[:500]) from None

    def orphans(self, run_id: str) -> list[Sandbox]:
        """The run's pods another runner started (by label and annotation) that still run;
        those that do not run any more are deleted here."""
        selector = f"{MANAGED}=scratchbank,{RUN_LABEL}={label_value(check_run_id(run_id))}"
        try:
            pods: list[Any] = self.core.list_namespaced_pod(
                self.namespace, label_selector=selector, _request_timeout=self.request_seconds
            ).items
        except ApiException as error:
            raise SandboxGone(f"cannot list the run's pods: {_said(error)}") from None
        except Exception as error:
            raise SandboxGone(f"cannot list the run's pods: {error}"[:500]) from None
        found: list[Sandbox] = []
        for pod in pods:
            name = pod.metadata.name
            if name in self.started or (pod.metadata.annotations or {}).get(RUN_ANNOTATION) != run_id:
                continue
            self.started.add(name)
            try:
                running = judge(pod, self.container) == "running"
            except SandboxNotStarted:
                running = False
            if not running:
                self._delete(name, quiet=True)
                continue
            try:
                found.append(self._sandbox(name))
            except SandboxGone:
                continue
        return found


def _said(error: ApiException) -> str:
    """The API server's status line: code, reason, and the Status message it sent."""
    message = ""
    with contextlib.suppress(ValueError, AttributeError):
        message = json.loads(error.body or "{}").get("message", "")
    hint = " (check the runner's Role: deploy/rbac.yaml)" if error.status == 403 else ""
    return f"{error.status} {error.reason}: {message}{hint}"[:500]
