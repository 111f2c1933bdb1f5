"""The package's version, in a leaf module so that its own modules (provenance) need not import the package's
``__init__`` (which imports the verl glue): dependencies point one way."""

__version__ = "0.1.0"
