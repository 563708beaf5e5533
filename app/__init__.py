"""The composition root: the daemon that wires the core, the mesh runtime and the surfaces
together, the ``hyphae`` CLI, ``hyphae doctor``, and the mesh wiring.

Nothing imports this package; it imports everything. The process-wide settings that
must precede every other import (BLAS threads) are made here, on the way in.
"""

import os as _os

# One BLAS thread per operation: a node runs many small matrix products from several
# worker threads at once, and multi-threaded BLAS on top of that thrashes the cores
# (measured: 15 ms vs 23-66 ms per embedded text on 2 busy cores). Set before numpy loads.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_var, "1")
