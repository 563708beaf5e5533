"""The HTTP surfaces over the one application core: REST (with the dashboard) in ``api.rest``.

Each surface is a transport adapter over :class:`node.service.MemoryService`: it parses,
authenticates through the facade, calls it, and shapes the answer. Surfaces never import
each other, the composition root (``app``), or any memory logic of their own.
"""
