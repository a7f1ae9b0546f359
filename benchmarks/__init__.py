"""brooq's benchmark suite: ``python -m benchmarks`` (``make bench``); see README.md."""
