"""The propagation-research harness: the production mesh engine on a simulated network.

Module map: :mod:`.network` (links, partitions, churn, the engine host), :mod:`.workload`
(clustered interests and ground truth), :mod:`.strategies` (hyphae and the yardsticks),
:mod:`.metrics`, :mod:`.runner` (one run), :mod:`.sweep` (a grid), :mod:`.plots`,
:mod:`.cli`. DESIGN §9.
"""
