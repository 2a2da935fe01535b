"""Runnable example agents; each directory has a README and a `main()` the tests run."""
