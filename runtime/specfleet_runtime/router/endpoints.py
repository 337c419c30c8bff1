"""Endpoint selection and EndpointSlice translation (pure: no I/O).

- `endpoints_from_slices`: EndpointSlice JSON documents of a pool's Service -> ready base URLs
  (optionally rewriting addresses with `AddressMap`, for test beds whose pod IPs are not routable).
- `resolve_pool`: the classified pool, or the other one when the config's fallback allows it.
- `choose_endpoint`: least outstanding requests among a pool's endpoints.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Literal

from specfleet_runtime.names import PoolName, other_pool

# The label Kubernetes puts on every EndpointSlice of a Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# (from, to) network pairs of equal size: an address in `from` keeps its host bits and moves to `to`.
AddressMap = tuple[tuple[IPNetwork, IPNetwork], ...]


def parse_address_map(text: str) -> tuple[IPNetwork, IPNetwork]:
    """`FROM_CIDR=TO_CIDR`, e.g. `10.0.0.0/8=127.0.0.0/8`; ValueError unless both are the same size."""
    source_text, sep, target_text = text.partition("=")
    if not sep:
        raise ValueError(f"expected FROM_CIDR=TO_CIDR, got {text!r}")
    source = ipaddress.ip_network(source_text.strip())
    target = ipaddress.ip_network(target_text.strip())
    if source.version != target.version or source.prefixlen != target.prefixlen:
        raise ValueError(f"{text!r}: both networks must have the same IP version and prefix length")
    return source, target


def map_address(address: str, address_map: AddressMap) -> str:
    """`address` moved by the first mapping whose source network holds it; unchanged if none does."""
    if not address_map:
        return address
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    for source, target in address_map:
        if ip.version == source.version and ip in source:
            offset = int(ip) - int(source.network_address)
            return str(ipaddress.ip_address(int(target.network_address) + offset))
    return address


def _slice_port(ports: Any, wanted: int) -> int | None:
    """The port to use from a slice: the configured number if listed, else the slice's only port."""
    if not isinstance(ports, list):
        return None
    numbers: list[int] = [
        p["port"] for p in ports if isinstance(p, Mapping) and isinstance(p.get("port"), int)
    ]
    if wanted in numbers:
        return wanted
    # A Service with one port needs no name matching; with several we cannot guess.
    if len(numbers) == 1:
        return numbers[0]
    return None


def _is_ready(endpoint: Mapping[str, Any]) -> bool:
    conditions = endpoint.get("conditions")
    if not isinstance(conditions, Mapping):
        return True
    # The API says a missing `ready` means unknown and should be treated as ready.
    return conditions.get("ready") is not False


def endpoints_from_slices(
    slices: Iterable[Mapping[str, Any]], port: int, address_map: AddressMap = ()
) -> tuple[str, ...]:
    """Base URLs (`http://ip:port`) of ready endpoints in these EndpointSlices, sorted and unique.

    Slices are JSON as the API serves them (camelCase). Endpoints that are not ready (which includes
    terminating ones), FQDN slices and slices without a usable port are left out.
    """
    urls: set[str] = set()
    for item in slices:
        address_type = item.get("addressType", "IPv4")
        if address_type not in ("IPv4", "IPv6"):
            continue
        chosen = _slice_port(item.get("ports"), port)
        if chosen is None:
            continue
        for endpoint in item.get("endpoints") or ():
            if not isinstance(endpoint, Mapping) or not _is_ready(endpoint):
                continue
            for address in endpoint.get("addresses") or ():
                if not isinstance(address, str) or not address:
                    continue
                mapped = map_address(address, address_map)
                host = f"[{mapped}]" if address_type == "IPv6" else mapped
                urls.add(f"http://{host}:{chosen}")
    return tuple(sorted(urls))


def resolve_pool(
    wanted: PoolName,
    endpoints: Mapping[str, Sequence[str]],
    fallback: Literal["otherPool", "reject"],
) -> PoolName | None:
    """The pool to serve from: `wanted` if it has endpoints, else the other pool if allowed, else None."""
    if endpoints.get(wanted):
        return wanted
    if fallback == "otherPool" and endpoints.get(other_pool(wanted)):
        return other_pool(wanted)
    return None


def choose_endpoint(
    endpoints: Sequence[str],
    outstanding: Mapping[str, int],
    excluded: Collection[str] = (),
    start: int = 0,
) -> str | None:
    """The endpoint with the fewest outstanding requests, or None if every endpoint is excluded.

    Ties go to the first endpoint at or after index `start` (callers rotate it), so equally loaded
    endpoints take turns instead of the first one taking every burst.
    """
    best: str | None = None
    best_load = 0
    count = len(endpoints)
    for offset in range(count):
        url = endpoints[(start + offset) % count]
        if url in excluded:
            continue
        load = outstanding.get(url, 0)
        if best is None or load < best_load:
            best, best_load = url, load
    return best
