#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gateway_worker
short_description: Drain one worker out of a vllm-router gateway, or put it back, through the router's admin API
description:
  - Runs on the gateway host (the router's admin API answers on loopback only) and acts on that host's router.
  - Reads the router's worker list (C(GET {router_url}/list_workers)). With I(state=absent) a listed worker is
    removed (C(POST /remove_worker?url=...)); with I(state=present) a worker not listed is added
    (C(POST /add_worker?url=...), which the router answers only once the worker's C(/health) answers, hence
    I(timeout)). A worker already in the wanted state is left alone.
  - Changed only when the router's worker list really changed. vllm-router answers C(/remove_worker) with 200
    whether or not it listed the worker, so the list is read again after a removal - a worker still listed
    fails. An C(/add_worker) answered 400 while the router lists the worker (C(Worker ... already exists))
    means another run got there first - nothing changed, not a failure; any other refusal fails with the
    router's answer.
  - A router that does not answer (not installed or not running yet, for example on the first run of a site
    where the serving hosts come before the gateway) is left alone - ok, not changed, not failed, with a
    message (C(answering) false).
  - With I(state=absent) and I(drain_timeout) above 0 it then waits, polling I(metrics_url) every
    I(drain_interval) seconds, until the router's Prometheus gauge C(vllm_router_running_requests) for that
    worker (the requests it routed there and that have not finished) reads 0; no line for the worker reads 0.
    It waits also when the worker was already out of the list (an earlier run took it out). After
    I(drain_timeout) seconds it fails naming the worker and the fix, or with I(drain_timeout_fails=false)
    warns and returns. A C(/metrics) that does not answer ends the wait with a warning.
  - Check mode - reads the list and returns C(changed) exactly as a real run would, posts nothing and does
    not wait for the drain. Diff mode - the router's worker list before and after.
  - Standard library and ansible-core's C(open_url) only; Python 3.8+.
options:
  url:
    description:
      - The worker's URL exactly as the router lists it, C(http://<address>:<port>) or C(https://...), with
        no path, query or user part.
    type: str
    required: true
  state:
    description:
      - C(absent) takes the worker out of the router and waits for its requests in flight; C(present) puts it back.
    type: str
    choices: [absent, present]
    default: present
  router_url:
    description: The router's admin API base, for example C(http://127.0.0.1:8081) (no path).
    type: str
    required: true
  metrics_url:
    description:
      - The router's Prometheus metrics, for example C(http://127.0.0.1:29000/metrics). Needed for the drain
        (I(state=absent) with I(drain_timeout) above 0).
    type: str
  drain_timeout:
    description:
      - Seconds to wait for the requests in flight to the worker to finish (I(state=absent)). 0 does not
        read the gauge nor wait (a caller that waits on the worker's own count, as the serve role's rollout).
    type: int
    default: 900
  drain_timeout_fails:
    description: Fail when requests are still in flight after I(drain_timeout); false warns and returns.
    type: bool
    default: true
  drain_interval:
    description: Seconds between two reads of the gauge while the drain waits.
    type: float
    default: 2
  timeout:
    description:
      - Seconds C(/add_worker) may take. The router answers it only once the worker's C(/health) answers
        (up to its C(--worker-startup-timeout-secs)).
    type: float
    default: 120
  request_timeout:
    description: Seconds every other request (the list, the removal, a read of the metrics) may take.
    type: float
    default: 10
notes:
  - Check mode - the list is read and the change predicted; nothing is posted, no drain wait.
  - The gateway role's C(worker) entry point (roles/gateway/tasks/worker.yml) runs it on every gateway host.
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Take the worker out of every gateway (no wait here)
  gateway_worker:
    url: https://10.20.1.12:8000
    state: absent
    router_url: http://127.0.0.1:8081
    drain_timeout: 0
  delegate_to: "{{ item }}"
  loop: "{{ groups['gateways'] }}"

- name: Then wait on each gateway until no request routed to it is left
  gateway_worker:
    url: https://10.20.1.12:8000
    state: absent
    router_url: http://127.0.0.1:8081
    metrics_url: http://127.0.0.1:29000/metrics
    drain_timeout: 900
  delegate_to: "{{ item }}"
  loop: "{{ groups['gateways'] }}"

- name: Put it back
  gateway_worker:
    url: https://10.20.1.12:8000
    state: present
    router_url: http://127.0.0.1:8081
  delegate_to: "{{ item }}"
  loop: "{{ groups['gateways'] }}"
"""

RETURN = r"""
answering:
  description: The router answered its worker list (false - it was left alone).
  returned: always
  type: bool
action:
  description: C(remove) or C(add) when the list was (or, in check mode, would be) changed; null otherwise.
  returned: always
  type: str
workers_before:
  description: The router's worker list as read first (empty when it did not answer).
  returned: always
  type: list
  elements: str
workers:
  description: The router's worker list after the change (in check mode, as it would be).
  returned: always
  type: list
  elements: str
  sample: ["https://10.20.1.11:8000", "https://10.20.1.13:8000"]
in_flight:
  description: The worker's running requests on the router at the last read of the drain; null when not read.
  returned: always
  type: float
drain_waited_s:
  description: Seconds the drain waited.
  returned: always
  type: float
router_answer:
  description: The router's answer to the POST (its body, cut to 300 characters); null when nothing was posted.
  returned: always
  type: str
msg:
  description: One line - what was found and done (or would be done, in check mode).
  returned: always
  type: str
"""

import json
import re
import time

from urllib.error import HTTPError
from urllib.parse import quote, urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

GAUGE = "vllm_router_running_requests"
SAMPLE = re.compile(r"^%s\{([^}]*)\}\s+(\S+)" % GAUGE)
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class NotAnswering(Exception):
    """The router (or its metrics) did not answer; the reason is the message."""


def url_problem(url, what, path_allowed=False):
    """Why `url` is not a usable http(s) URL (None when it is)."""
    if not url or any(c.isspace() for c in url):
        return "%s %r is empty or holds a space" % (what, url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return "%s %r does not parse as a URL (%s)" % (what, url, exc)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "%s %r is not an http:// or https:// URL with a host" % (what, url)
    if "@" in parts.netloc:
        return "%s %r has a user part" % (what, url)
    if not path_allowed and (parts.path or parts.query or parts.fragment or url.endswith("?")):
        return "%s %r has a path, query or fragment after the address" % (what, url)
    if port is None and not path_allowed:
        return "%s %r has no port" % (what, url)
    return None


def http(method, url, timeout):
    """(status, body text) of one request; raises NotAnswering when no HTTP answer came."""
    try:
        # Loopback: no proxy from the environment, no credentials from ~/.netrc.
        resp = open_url(url, method=method, timeout=timeout, use_proxy=False, use_netrc=False)
        try:
            return resp.getcode(), resp.read().decode("utf-8", "replace")
        finally:
            resp.close()
    except HTTPError as exc:
        try:
            body = exc.read().decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - the body may be gone with the connection
            body = ""
        return exc.code, body
    except Exception as exc:  # noqa: BLE001 - refused, reset, timed out, no route: no answer
        reason = getattr(exc, "reason", None) or exc
        raise NotAnswering("%s %s: %s" % (method, url, reason)) from None


def list_workers(router_url, timeout):
    """The router's worker URLs; NotAnswering when it does not answer as a router;
    ValueError when it answers 200 with JSON that is not a worker list."""
    where = router_url + "/list_workers"
    status, body = http("GET", where, timeout)
    if status != 200:
        raise NotAnswering("GET %s answered HTTP %d %s" % (where, status, body[:200].strip()))
    try:
        doc = json.loads(body)
    except ValueError:
        raise NotAnswering("GET %s answered something that is not JSON: %r" % (where, body[:200])) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("urls"), list):
        raise ValueError("GET %s answered without a list of urls: %r" % (where, body[:300]))
    return [str(u) for u in doc["urls"]]


def running_requests(text, worker):
    """The sum of the gauge's samples labelled worker=`worker` (0 without any)."""
    total = 0.0
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        labels = dict((k, v.replace('\\"', '"').replace("\\\\", "\\")) for k, v in LABEL.findall(m.group(1)))
        if labels.get("worker") == worker:
            try:
                total += float(m.group(2))
            except ValueError:
                continue
    return total


def drain(module, p, result, clock=time.monotonic, sleep=time.sleep):
    """Wait for the worker's running requests on this router to reach 0; fills result."""
    url, metrics_url = p["url"], p["metrics_url"]
    start = clock()
    deadline = start + p["drain_timeout"]
    while True:
        try:
            status, body = http("GET", metrics_url, p["request_timeout"])
            if status != 200:
                raise NotAnswering("GET %s answered HTTP %d" % (metrics_url, status))
        except NotAnswering as exc:
            result["drain_waited_s"] = round(clock() - start, 1)
            module.warn(
                "%s: the router's metrics did not answer (%s), so the requests still in flight to %s "
                "could not be waited for" % (p["router_url"], exc, url)
            )
            return "metrics did not answer, drain not waited for"
        in_flight = running_requests(body, url)
        result["in_flight"] = in_flight
        now = clock()
        result["drain_waited_s"] = round(now - start, 1)
        if in_flight == 0:
            waited = result["drain_waited_s"]
            return "no request left in flight to it" + (" after %.0f s" % waited if waited >= 1 else "")
        if now >= deadline:
            break
        sleep(max(0.0, min(p["drain_interval"], deadline - now)))
    message = (
        "%s still had %g request(s) in flight through the gateway %s after %d s of drain. It is out of this "
        "gateway's worker list (no new request reaches it from here)."
        % (url, result["in_flight"], p["router_url"], p["drain_timeout"])
    )
    if p["drain_timeout_fails"]:
        module.fail_json(
            msg=message + " Fix: wait longer (drain_timeout: the gateway role's gateway_drain_timeout) or set "
            "gateway_drain_timeout_fails: false (drain_timeout_fails) to go on and cut them.",
            **result,
        )
    module.warn(message + " Going on (drain_timeout_fails is false): those requests may be cut.")
    return "%g request(s) still in flight after %d s, going on" % (result["in_flight"], p["drain_timeout"])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            state=dict(type="str", choices=["absent", "present"], default="present"),
            router_url=dict(type="str", required=True),
            metrics_url=dict(type="str"),
            drain_timeout=dict(type="int", default=900),
            drain_timeout_fails=dict(type="bool", default=True),
            drain_interval=dict(type="float", default=2.0),
            timeout=dict(type="float", default=120.0),
            request_timeout=dict(type="float", default=10.0),
        ),
        supports_check_mode=True,
    )
    p = module.params
    problem = url_problem(p["url"], "url")
    if problem:
        module.fail_json(
            msg="%s. Fix: give the worker's URL as the gateways list it, http://<address>:<port> (the gateway "
            "role's gateway_worker_url, or gateway_worker_host for an inventory host's), for example "
            "http://10.20.1.11:8000" % problem
        )
    p["router_url"] = (p["router_url"] or "").rstrip("/")
    problem = url_problem(p["router_url"], "router_url")
    if problem:
        module.fail_json(msg="%s. Fix: give the router's admin base, for example http://127.0.0.1:8081" % problem)
    draining = p["state"] == "absent" and p["drain_timeout"] > 0
    if draining:
        if p["metrics_url"]:
            problem = url_problem(p["metrics_url"], "metrics_url", path_allowed=True)
        else:
            problem = "metrics_url is not set"
        if problem:
            module.fail_json(
                msg="%s, and the drain (state absent, drain_timeout %d) reads the router's running requests "
                "there. Fix: give the router's metrics, for example http://127.0.0.1:29000/metrics, or "
                "drain_timeout: 0 not to wait" % (problem, p["drain_timeout"])
            )
    for key in ("timeout", "request_timeout"):
        if p[key] <= 0:
            module.fail_json(msg="%s is %s; it must be positive. Fix: leave the default" % (key, p[key]))
    if p["drain_timeout"] < 0 or p["drain_interval"] < 0:
        module.fail_json(msg="drain_timeout and drain_interval cannot be negative")

    url, router_url, absent = p["url"], p["router_url"], p["state"] == "absent"
    result = dict(
        changed=False,
        answering=False,
        action=None,
        workers_before=[],
        workers=[],
        in_flight=None,
        drain_waited_s=0.0,
        router_answer=None,
    )
    try:
        before = list_workers(router_url, p["request_timeout"])
    except NotAnswering as exc:
        result["msg"] = "no gateway answers at %s (not installed or not running: %s): %s left as it is there" % (
            router_url,
            exc,
            url,
        )
        module.exit_json(**result)
    except ValueError as exc:
        module.fail_json(msg="%s. Fix: router_url must be vllm-router's admin API" % exc, **result)
    result.update(answering=True, workers_before=before, workers=list(before))
    listed = url in before
    todo = listed if absent else not listed
    action = ("remove" if absent else "add") if todo else None
    result["action"] = action
    if todo:
        result["workers"] = [u for u in before if u != url] if absent else before + [url]
    if module._diff:
        result["diff"] = dict(
            before_header="%s/list_workers" % router_url,
            after_header="%s/list_workers" % router_url,
            before="".join(u + "\n" for u in sorted(before)),
            after="".join(u + "\n" for u in sorted(result["workers"])),
        )

    if module.check_mode:
        result["changed"] = todo
        result["msg"] = (
            "would %s %s on %s" % (action, url, router_url)
            if todo
            else "%s is already %s on %s" % (url, "out" if absent else "in", router_url)
        ) + ("" if not draining else "; check mode: the drain is not waited for")
        module.exit_json(**result)

    done = "%s was already %s on %s" % (url, "out" if absent else "in", router_url)
    if todo:
        where = "%s/%s_worker?url=%s" % (router_url, action, quote(url, safe=""))
        try:
            status, body = http("POST", where, p["timeout"] if not absent else p["request_timeout"])
        except NotAnswering as exc:
            hint = (
                " The router answers /add_worker only once %s/health answers (it keeps trying up to its "
                "--worker-startup-timeout-secs). Fix: make sure the worker is up and its /health answers from "
                "this gateway host, or raise timeout" % url
                if not absent
                else " Fix: look at the router (systemctl status kunlun-gateway) and run again"
            )
            module.fail_json(
                msg="%s listed its workers, then the POST got no answer: %s.%s" % (router_url, exc, hint), **result
            )
        result["router_answer"] = body[:300].strip()
        try:
            after = list_workers(router_url, p["request_timeout"])
        except (NotAnswering, ValueError):
            after = None
        if status == 200:
            if after is not None:
                result["workers"] = after
            # /remove_worker answers 200 whether or not it removed anything: the list says.
            if absent and after is not None and url in after:
                module.fail_json(
                    msg="%s answered POST /remove_worker for %s with 200 (%s) but still lists it. Fix: look for "
                    "another run adding it back at the same time, then run again"
                    % (router_url, url, result["router_answer"]),
                    **result,
                )
            result["changed"] = True
            done = ("removed %s from %s" if absent else "added %s to %s") % (url, router_url)
        elif status == 400 and after is not None and (url in after) != absent:
            # Another run got there first ("Worker ... already exists"): nothing changed here.
            result["workers"] = after
            done = "%s: %s was %s by another run first (%s)" % (
                router_url,
                url,
                "removed" if absent else "added",
                result["router_answer"],
            )
        else:
            module.fail_json(
                msg="%s answered POST /%s_worker for %s with HTTP %d: %s. Fix: %s"
                % (
                    router_url,
                    action,
                    url,
                    status,
                    result["router_answer"] or "(no body)",
                    "make sure the worker is up and its /health answers from this gateway host (the router "
                    "adds only a healthy worker; an https worker only with a certificate of the CA the router "
                    "trusts, its SSL_CERT_FILE: openssl s_client -connect <address>:<port> -CAfile <that file> "
                    "says why not), then run again"
                    if not absent
                    else "look at the router's log (journalctl -u kunlun-gateway) and run again",
                ),
                **result,
            )
    if module._diff:
        result["diff"]["after"] = "".join(u + "\n" for u in sorted(result["workers"]))
    if draining:
        done += "; " + drain(module, p, result)
    result["msg"] = done
    module.exit_json(**result)


if __name__ == "__main__":
    main()
