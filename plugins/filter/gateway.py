# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the gateway role works out before it calls the routers: the worker URLs the
router balances over (a drain or a restore of one worker is the module
library/gateway_worker.py's, on each gateway host). Documentation: gateway_worker_urls.yml
beside this file."""

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


class FilterModule:
    def filters(self):
        return {"gateway_worker_urls": gateway_worker_urls}
