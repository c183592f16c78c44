# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's own address towards a host: the source address its kernel picks for a
connection to it, which is the address the host's firewall sees when the controller
measures the host directly (roles/firewall/tasks/admit.yml)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
name: route_source
short_description: The controller's source address towards each given address
description:
  - For each address or host name, the local address the controller's kernel would send from to reach it
    (a UDP socket connected to it, which sends nothing), so the address a host's firewall sees for the
    controller's own connections.
  - A name resolves on the controller; its first address is used.
version_added: "0.1.0"
author:
  - kunlun-fleet contributors (@kunlun-fleet)
options:
  _terms:
    description: Addresses or host names of the hosts.
    required: true
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: The controller's address towards a serving host
  ansible.builtin.debug:
    msg: "{{ lookup('route_source', '10.20.1.11') }}"
"""

RETURN = r"""
_raw:
  description: The source address towards each term, in the order given.
  type: list
  elements: str
"""

import socket

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase


def source_for(destination, port=9):
    """The local address the kernel picks to reach `destination` (no packet is sent)."""
    try:
        found = socket.getaddrinfo(destination, port, 0, socket.SOCK_DGRAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise AnsibleLookupError(
            "route_source: %s does not resolve on the controller (%s)" % (destination, exc)
        ) from exc
    sock = socket.socket(found[0], socket.SOCK_DGRAM)
    try:
        sock.connect(found[4])
        return sock.getsockname()[0].split("%", 1)[0]
    except OSError as exc:
        raise AnsibleLookupError("route_source: the controller has no route to %s (%s)" % (destination, exc)) from exc
    finally:
        sock.close()


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [source_for(str(term)) for term in terms]
