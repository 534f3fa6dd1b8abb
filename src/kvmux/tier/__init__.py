"""One tier's two halves: the scheduler's bookkeeping (no torch) and the worker's copies.

``scheduler`` plans, ``index`` is the scheduler's view of what the tier holds, ``plan`` is
what one step asks of the workers, ``worker`` runs it and ``transfer`` copies blocks.
"""
