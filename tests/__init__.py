"""The tests, and the proof harness beside them (:mod:`tests.harness`). A package, so that this ``tests`` and not
verl's own top-level ``tests`` package is imported wherever the checkout comes first on the path."""
