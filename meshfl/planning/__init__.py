"""Capability-aware planning: from measured device profiles to each device's share of a round."""

from meshfl.planning.planner import (
    Plan,
    battery_sit_out,
    byte_budgets,
    link_aware_graph,
    no_wait,
    plan_devices,
    quorum_size,
    slow_nodes,
    work_fractions,
)

__all__ = [
    "Plan",
    "battery_sit_out",
    "byte_budgets",
    "link_aware_graph",
    "no_wait",
    "plan_devices",
    "quorum_size",
    "slow_nodes",
    "work_fractions",
]
