"""What the tests share: model files and references, servers started and stopped, hermetic homes.

Benchmarks use the same helpers (they put the repository root on sys.path).
"""
