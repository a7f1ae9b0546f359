"""brooq and pgqueuer adapters for the neutral harness, and its native runner (README.md)."""
