"""Online re-planning: what the gateways saw (window), whether it left the plan behind (drift), and the
scenario a new plan is optimised for (observed). docs/replan.md."""
