"""One tier's two halves: ``scheduler`` (bookkeeping, no torch) and ``worker`` (copies, torch).

``scheduler/`` plans: ``scheduler.py`` is the TierScheduler, ``index.py`` its view of what
the tier holds, ``generation.py`` the tier's generation record, ``plan.py`` what one step
asks of the workers. ``worker/`` runs a plan: ``base.py`` is what every worker shares,
``store_worker.py`` moves entries between the KV cache and a byte store, ``slab_worker.py``
between the KV cache and host slots (``slab.py``), and ``transfer.py`` copies blocks.

``fences.py`` stays here: it holds both sides of one protocol, the scheduler's
``SavedBlocks`` and the workers' ``InFlightSaves``, which must agree on ``FENCE_STEPS``.
The worker side may import the scheduler side (the plan it runs); never the reverse.
"""
