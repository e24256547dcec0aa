"""The campaign's slices (see :mod:`benchmarks.gpu.campaign` for what each provides)."""
