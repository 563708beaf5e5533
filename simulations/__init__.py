"""The propagation-research harness: the production mesh engine on a simulated network.

Module map: :mod:`.network` (links, partitions, churn, the engine host), :mod:`.workload`
(clustered interests and ground truth), :mod:`.labelled` (a labelled team stream as a workload),
:mod:`.strategies` (hyphae and the yardsticks), :mod:`.metrics`, :mod:`.semantic` (precision and
recall against relevance labels, before and after admission), :mod:`.runner` (one run), :mod:`.sweep` (a grid), :mod:`.plots`,
:mod:`.cli`. DESIGN §9.
"""
