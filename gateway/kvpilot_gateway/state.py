"""What the gateway's routes share, one object built by main.py: the settings, the upstream
client, the catalog, the body budget, the replicas' loads, the balancer, the holds, the rate
limits, the metrics and the drain's count. Apart from app.py, so that the parts that take it
(failover.py, status_routes.py) import it without importing the routes."""

from collections.abc import Callable

import aiohttp

from kvpilot_common.http.rate_limit import RateLimits
from kvpilot_gateway.balance import Balancer
from kvpilot_gateway.budget import BodyBudget, tenant_share
from kvpilot_gateway.catalog import Catalog, Key, Model
from kvpilot_gateway.holding import Holds
from kvpilot_gateway.load import Loads
from kvpilot_gateway.metrics import GatewayMetrics
from kvpilot_gateway.options import Settings


class State:
    """Everything the routes share; main.py builds it and runs its background parts."""

    def __init__(
        self,
        settings: Settings,
        client: aiohttp.ClientSession | None,
        announce: Callable[[Key, int], None],
    ) -> None:
        self.settings, self.client = settings, client
        self.catalog = Catalog(settings.names)
        limit = settings.max_held_bytes
        self.bodies = BodyBudget(limit, tenant_share(limit, settings.max_held_bytes_per_tenant))
        self.loads = Loads()
        self.balancer = Balancer(settings.routing, settings.load_factor)
        self.metrics = GatewayMetrics()
        self.holds = Holds(settings, self.catalog, announce, self.metrics)
        self.synced = False
        self.draining = False
        self.in_flight = 0  # read by the drain
        self.limits = RateLimits()

    def usable(self, model: Model) -> list[str]:
        return [e for e in self.catalog.endpoints(model.key) if not self.loads.is_down(e)]

    def on_drain(self) -> None:
        """The drain began (kvpilot_common.http.serving): held requests are answered now."""
        self.holds.close()
