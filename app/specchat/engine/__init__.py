"""The MLX engine: loading, drafters, acceptance, the speculative loop, stats.

No Qt here, and it runs headless. Importing it does nothing else: a process
calls ``specchat.startup.prepare()`` first, so the system BLAS is loaded
before MLX (see blas.py).
"""
