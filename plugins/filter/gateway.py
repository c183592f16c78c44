# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the gateway role works out before it calls the routers: the worker URLs the
router balances over, and the gateways whose worker list a drain or a restore changes.
Documentation: gateway_worker_urls.yml and gateway_worker_todo.yml beside this file."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def gateway_worker_urls(workers, group_hosts, worker_urls):
    """`workers` (gateway_workers) when it lists any, else the URL of each host of the worker
    group (`group_hosts`, in its order) from `worker_urls` (kunlun_stack_worker_urls)."""
    if len(workers) > 0:
        return workers
    urls = []
    for host in group_hosts:
        if host not in worker_urls:
            raise ValueError("gateway_worker_urls: host %s has no worker URL (kunlun_stack_worker_urls)" % host)
        urls.append(worker_urls[host])
    return urls


def gateway_worker_todo(answering, url, state):
    """The gateways (each answer's `gateway_gw`) whose router's worker list must change:
    those listing `url` when `state` is absent, those not listing it otherwise.

    `answering` are the /list_workers results of the gateways that answered (status 200, a
    JSON body with C(urls))."""
    todo = []
    for answer in answering:
        body = answer["json"]
        if not isinstance(body, dict) or "urls" not in body:
            raise ValueError(
                "gateway_worker_todo: %s answered /list_workers without a list of urls: %r"
                % (answer.get("gateway_gw"), body)
            )
        listed = url in body["urls"]
        if listed == (state == "absent"):
            todo.append(answer["gateway_gw"])
    return todo


class FilterModule:
    def filters(self):
        return {"gateway_worker_urls": gateway_worker_urls, "gateway_worker_todo": gateway_worker_todo}
