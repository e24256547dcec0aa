"""Limits on the torch CPU thread count a user may ask for (``--threads``,
``train.threads``)."""

# Far above the cores of any real machine. torch accepts any count, then crashes
# (a segmentation fault at 100,000 threads) or overflows deep inside an operator.
MAX_THREADS = 1024
