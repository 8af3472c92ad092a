"""kvpilot_common.demand, the annotation contract between the gateways and the operator: names
the API server accepts, a round trip, stale and malformed entries."""

import re

import pytest

from kvpilot_common import demand

# An annotation key: an optional DNS-subdomain prefix and "/", then a name part of at most 63
# characters, alphanumeric at both ends (the API server's validation).
NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    "gateway_id",
    [
        "gw-1",
        "kvpilot-gateway-7d9f8c6b5-x2x4q",
        "a" * 63,
        "a" * 64,
        "kvpilot-gateway." + "x" * 240,  # a pod name can reach 253 characters
        "gateway@node:1/2",
        "-leading-and-trailing-",
        "@@@",
    ],
)
def test_annotation_key_is_a_valid_annotation_name(gateway_id):
    key = demand.annotation_key(gateway_id)
    prefix, name = key.split("/")
    assert f"{prefix}/" == demand.PREFIX
    assert NAME_PART.match(name) and len(name) <= 63, name


def test_long_or_odd_ids_stay_distinct():
    ids = ["a" * 64, "a" * 65, "gw/1", "gw:1", "gw 1"]
    assert len({demand.annotation_key(i) for i in ids}) == len(ids)
    assert demand.annotation_key("gw-1") == demand.PREFIX + "gw-1"  # a plain id is kept as is


def test_round_trip_sums_live_gateways_and_reports_the_latest():
    annotations = {
        demand.annotation_key("gw-1"): demand.encode(2, NOW - 3),
        demand.annotation_key("gw-2"): demand.encode(5, NOW - 1),
        demand.annotation_key("gw-3"): demand.encode(0, NOW),  # held none, but reported now
        "kvpilot.dev/last-handled-configuration": "{}",  # not a gateway's
    }
    assert demand.read(annotations, NOW) == demand.Demand(held=7, last=NOW)


def test_stale_entries_are_not_held_but_still_date_the_last_demand():
    old = NOW - demand.STALE_SECONDS - 1
    annotations = {demand.annotation_key("gone"): demand.encode(4, old)}
    assert demand.read(annotations, NOW) == demand.Demand(held=0, last=old)
    at_the_limit = {demand.annotation_key("gw"): demand.encode(4, NOW - demand.STALE_SECONDS)}
    assert demand.read(at_the_limit, NOW).held == 4


@pytest.mark.parametrize(
    "value",
    [
        "",
        "not json",
        "[]",
        "{}",
        '{"held": 3}',
        '{"held": "x", "time": "2026-01-01T00:00:00Z"}',
        '{"held": 3, "time": "yesterday"}',
        '{"held": 3, "time": 12}',
        "null",
    ],
)
def test_malformed_entries_are_ignored(value):
    annotations = {
        demand.PREFIX + "bad": value,
        demand.annotation_key("good"): demand.encode(1, NOW),
    }
    assert demand.read(annotations, NOW) == demand.Demand(held=1, last=NOW)


def test_no_annotations():
    assert demand.read(None, NOW) == demand.Demand(0, None)
    assert demand.read({}, NOW) == demand.Demand(0, None)
