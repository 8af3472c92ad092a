"""The body budget's accounting (budget.py): a holder's share, the pool, a parse's loan, and
everything given back when a request ends, however it ends."""

import pytest

from kvpilot_common.errors import OverloadedError, PayloadTooLargeError
from kvpilot_gateway.budget import BodyBudget, holder, tenant_share

MIB = 1 << 20


def test_a_holder_is_refused_at_its_share_and_others_still_fit():
    budget = BodyBudget(32 * MIB, 8 * MIB)
    with budget.lease("a") as first, budget.lease("a") as second, budget.lease("b") as other:
        first.add(5 * MIB)
        with pytest.raises(OverloadedError, match="one tenant may have"):
            second.add(4 * MIB)
        other.add(8 * MIB)
        assert budget.held == {"a": 5 * MIB, "b": 8 * MIB}
    assert (budget.used, budget.held) == (0, {})


def test_the_pool_bounds_all_holders_and_a_parse_borrows_from_it_alone():
    budget = BodyBudget(16 * MIB, 8 * MIB)
    with budget.lease("a") as a, budget.lease("b") as b, budget.lease("c") as c:
        a.add(8 * MIB)
        b.add(7 * MIB)
        with pytest.raises(OverloadedError, match="is full"):
            c.add(2 * MIB)
        with pytest.raises(PayloadTooLargeError), a.borrowed(17 * MIB):  # more than the pool
            pass
        b.add(MIB)  # b's own share: 8 MiB
        with pytest.raises(OverloadedError), c.borrowed(MIB):  # the pool is full, shares aside
            pass
        assert budget.held == {"a": 8 * MIB, "b": 8 * MIB}
    assert (budget.used, budget.held) == (0, {})


def test_shares_and_holders():
    assert tenant_share(32 * MIB, None) == 8 * MIB
    assert tenant_share(MIB, None) == MIB  # never more than the pool
    assert tenant_share(64 * MIB, None) == 16 * MIB
    with pytest.raises(ValueError, match="--max-held-bytes-per-tenant"):
        tenant_share(32 * MIB, MIB)  # less than one whole body
    assert holder("team-a", ("10.0.0.1", 5)) == "team-a"
    assert holder("", ("10.0.0.1", 5)) == "address 10.0.0.1"
    # One host holds a whole /64: rotating its addresses gets it no more shares.
    assert holder("", ("2001:db8::1", 5)) == holder("", ("2001:db8::ffff:1", 5))
    assert holder("", ("2001:db8::1", 5)) != holder("", ("2001:db8:0:1::1", 5))
