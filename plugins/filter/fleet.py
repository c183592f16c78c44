# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The effective configuration's calculations (roles/kunlun_stack/vars/main.yml): where each
host is reached, its worker URL, the fleet endpoint's URL, the merged serving environment,
the bundle's files by pin key, the names a certificate of the fleet CA carries.
Documentation: the .yml file of each filter beside this one."""

from __future__ import absolute_import, division, print_function

import ipaddress

__metaclass__ = type


def _first_set(*values):
    for value in values:
        if value not in (None, ""):
            return value
    return None


def fleet_serving_addresses(hosts, hostvars):
    """{host: address} for `hosts`: the host's kunlun_stack_serving_address when set, else
    its ansible_host, else its inventory name."""
    addresses = {}
    for host in hosts:
        variables = hostvars[host]
        addresses[host] = str(
            _first_set(
                variables.get("kunlun_stack_serving_address") if "kunlun_stack_serving_address" in variables else None,
                variables.get("ansible_host") if "ansible_host" in variables else None,
                host,
            )
        )
    return addresses


def fleet_worker_urls(addresses, port, scheme="http"):
    """{host: <scheme>://<address>:<port>} for every host of `addresses`."""
    if scheme not in ("http", "https"):
        raise ValueError("fleet_worker_urls: the scheme is %r; it must be http or https" % (scheme,))
    return dict((host, "%s://%s:%s" % (scheme, address, port)) for host, address in addresses.items())


def fleet_cert_sans(addresses):
    """The subjectAltName entries of a certificate for `addresses` (one address or a list):
    IP:<address> for an IPv4 or IPv6 address, DNS:<name> otherwise, in order, each once."""
    if isinstance(addresses, str):
        addresses = [addresses]
    sans = []
    for address in addresses:
        address = str(address).strip()
        if not address:
            raise ValueError("fleet_cert_sans: an empty address; every address must be an IP address or a DNS name")
        try:
            san = "IP:%s" % ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            san = "DNS:%s" % address
        if san not in sans:
            sans.append(san)
    return sans


def fleet_endpoint_url(gateway_hosts, addresses, port, scheme="http"):
    """The fleet endpoint's URL: the first gateway host's address at `port`, or '' when the
    fleet has no gateway host."""
    hosts = list(gateway_hosts or [])
    if not hosts:
        return ""
    if hosts[0] not in addresses:
        raise ValueError("fleet_endpoint_url: the gateway host %s has no serving address" % hosts[0])
    return "%s://%s:%s" % (scheme, addresses[hosts[0]], port)


def fleet_env_merge(base, overrides):
    """`base` with `overrides` merged over it; a variable overridden with null is removed."""
    merged = dict(base or {})
    merged.update(overrides or {})
    return dict((name, value) for name, value in merged.items() if value is not None)


def fleet_bundle_files(index):
    """{pin key: the artifact's path in the bundle} from bundle.yml's parsed content."""
    artifacts = (index or {}).get("artifacts") or {}
    return dict((key, entry["path"]) for key, entry in artifacts.items())


class FilterModule:
    def filters(self):
        return {
            "fleet_serving_addresses": fleet_serving_addresses,
            "fleet_worker_urls": fleet_worker_urls,
            "fleet_cert_sans": fleet_cert_sans,
            "fleet_endpoint_url": fleet_endpoint_url,
            "fleet_env_merge": fleet_env_merge,
            "fleet_bundle_files": fleet_bundle_files,
        }
