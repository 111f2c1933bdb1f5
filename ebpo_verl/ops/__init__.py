"""Operations helpers below everything else: atomic files, locks, shared-memory clean-up, node checks, the metrics
log, provenance and the package's error type. Nothing here imports verl."""
