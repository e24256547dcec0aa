"""The GPU campaign: paper-scale runs in short GPU allocations (slices).

    python -m benchmarks.gpu plan                      # the next pending slice and its size
    python -m benchmarks.gpu prepare SLICE             # CPU machine: what the call carries
    python -m benchmarks.gpu run SLICE --budget-s 520  # GPU machine: run, stop before S
    python -m benchmarks.gpu ingest DIR                # CPU machine: check, ledger, results

See ``benchmarks/README.md`` ("GPU campaign") for the workflow and the limits it fits.
"""
